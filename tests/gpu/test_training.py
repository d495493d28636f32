"""Training on the GPU: lossless policies bitwise equal to baseline, the plan's peak is the pool's,
nothing leaks over 200 steps (pool, pinned pool, NVML's used memory), a failed step leaves the pool as it
was."""

from __future__ import annotations

import time

import numpy as np
import pytest

import vmem
from vmem.optim import SGD

MODELS = {
    "vgg_cifar": lambda: vmem.models.get("vgg_cifar"),
    "resnet_cifar": lambda: vmem.models.get("resnet_cifar", depth=8),
}
LOSSLESS = [
    ("vdnn-all", {}),
    ("vdnn-conv", {}),
    ("vdnn-all:sync=event", {}),
    ("vdnn-all", {"poison": True}),
    ("vdnn-conv:sync=event", {"poison": True}),
    # the codec kernels on the GPU: zero-value compression before the copy (cDMA), Gist's lossless
    # encodings kept on the device
    ("vdnn-all:codec=zvc", {}),
    ("vdnn-all:codec=ssdc", {"poison": True}),
    ("gist", {}),
]


def train(make, policy, steps=5, batch=16, **device):
    net = make()
    dev = vmem.device("cuda:0", math="exact", memory="1GiB", pinned_memory="512MiB", **device)
    reports = []
    try:
        with vmem.Trainer(net, device=dev, policy=policy, optimizer=SGD(lr=0.01, momentum=0.9), seed=0) as trainer:
            rng = np.random.default_rng(0)
            for _ in range(steps):
                x = rng.standard_normal((batch,) + net.input_shape).astype(np.float32)
                reports.append(trainer.step(x, rng.integers(0, 10, batch)))
            plan = trainer.plans[batch]
    finally:
        dev.close()
    return net.params, reports, plan


@pytest.mark.parametrize("model", sorted(MODELS))
def test_lossless_policies_are_bitwise_equal_to_baseline(model):
    ref, reports, plan = train(MODELS[model], "baseline")
    assert all(r.peak_bytes == plan.peak_bytes for r in reports)
    for policy, device in LOSSLESS:
        params, reports, plan = train(MODELS[model], policy, **device)
        assert all(np.array_equal(ref[k], params[k]) for k in ref), f"{policy} {device} changed the weights"
        if policy == "gist":  # nothing offloaded; ssdc's blocks are the plan's (denser data: spilled to the host)
            assert all(r.peak_bytes == plan.peak_bytes for r in reports), policy
            continue
        if "codec" in policy:  # what crosses the bus depends on the values; the plan assumes a density
            assert 0 < reports[-1].offloaded_bytes, policy
            continue
        assert reports[-1].offloaded_bytes == plan.offloaded_bytes > 0
        assert reports[-1].peak_bytes == plan.peak_bytes, policy


def test_lossless_policies_through_the_graph_api_are_bitwise_equal_to_its_baseline():
    """The graph API's engines (conv_api="graph"): offloading still changes nothing, and the plan's peak is
    the pool's (the engines' workspaces come from the catalog)."""
    ref, reports, plan = train(MODELS["vgg_cifar"], "baseline:algos=performance", conv_api="graph")
    assert all(r.peak_bytes == plan.peak_bytes for r in reports)
    params, reports, plan = train(MODELS["vgg_cifar"], "vdnn-all:algos=performance", conv_api="graph")
    assert all(np.array_equal(ref[k], params[k]) for k in ref)
    assert reports[-1].peak_bytes == plan.peak_bytes and reports[-1].offloaded_bytes == plan.offloaded_bytes > 0


def test_bf16_through_the_graph_api_fuses_the_convolutions_relus_and_follows_the_legacy_api():
    """conv_api="graph" in bf16: half maps as stored, a convolution and the ReLU after it one fused graph where
    cuDNN builds one (else its engines and vmem's bias+ReLU kernel); the step peaks where planned, and the
    weights stay close to the legacy API's bf16 run (the fused forward rounds once where the legacy one rounds
    twice; cuDNN's engines add in their own order)."""
    pytest.importorskip("ml_dtypes")
    runs = {}
    for api in ("legacy", "graph"):
        net = MODELS["vgg_cifar"]()
        dev = vmem.device("cuda:0", memory="1GiB", pinned_memory="512MiB", conv_api=api)
        try:
            with vmem.Trainer(net, device=dev, policy="baseline", seed=0, precision="bf16") as trainer:
                rng = np.random.default_rng(0)
                for _ in range(3):
                    x = rng.standard_normal((16,) + net.input_shape).astype(np.float32)
                    report = trainer.step(x, rng.integers(0, 10, 16))
                    assert np.isfinite(report.loss) and report.peak_bytes == trainer.plans[16].peak_bytes
                algos = trainer.plans[16].plan.algos
        finally:
            dev.close()
        runs[api] = (net.params, algos)
    fused = [name for name, a in runs["graph"][1].items() if str(a.get("forward", "")).startswith("fused.")]
    print(f"graph API bf16: {len(fused)} fused forwards: {fused}")
    for k, w in runs["legacy"][0].items():
        np.testing.assert_allclose(runs["graph"][0][k], w, rtol=0.1, atol=0.05, err_msg=k)


def test_lossless_policies_on_a_device_with_nchw_algorithms_are_bitwise_equal_to_their_baseline():
    """nchw=True: the plan may pick algorithms run on NCHW copies (the model weighs winograd's arithmetic;
    each such algorithm is checked against float64 in test_layers.py); offloading still changes nothing
    and the plan's peak, copies included, is the pool's."""
    ref, reports, plan = train(MODELS["vgg_cifar"], "baseline:algos=performance", nchw=True)
    assert all(r.peak_bytes == plan.peak_bytes for r in reports)
    params, reports, plan = train(MODELS["vgg_cifar"], "vdnn-all:algos=performance", nchw=True)
    assert all(np.array_equal(ref[k], params[k]) for k in ref)
    assert reports[-1].peak_bytes == plan.peak_bytes and reports[-1].offloaded_bytes == plan.offloaded_bytes > 0


def test_nothing_leaks_over_200_steps():
    from vmem.device.cuda import nvml

    net = vmem.models.get("vgg_cifar", image_size=16)
    dev = vmem.device("cuda:0", math="exact", memory="512MiB", pinned_memory="256MiB")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16,) + net.input_shape).astype(np.float32)
    y = rng.integers(0, 10, 16)
    try:
        with vmem.Trainer(net, device=dev, policy="vdnn-all", seed=0) as trainer:
            for _ in range(10):
                trainer.step(x, y)
            in_use, pinned, used = dev.pool.in_use, dev.pinned.in_use, nvml.reading(0).get("used_bytes")
            for _ in range(200):
                trainer.step(x, y)
            dev.synchronize()
            assert dev.pool.in_use == in_use and dev.pinned.in_use == pinned == 0
            if used is not None:
                assert abs(nvml.reading(0)["used_bytes"] - used) <= 16 << 20
    finally:
        dev.close()


def test_a_failed_step_leaves_the_pool_as_it_was():
    net = vmem.models.get("vgg_cifar", image_size=16)
    dev = vmem.device("cuda:0", math="exact", memory="256MiB")
    try:
        with vmem.Trainer(net, device=dev, policy="vdnn-all", seed=0) as trainer:
            x, y = np.zeros((8, 3, 16, 16), np.float32), np.zeros(8, int)
            trainer.step(x, y)
            dev.synchronize()
            before = dev.pool.snapshot()
            layer = net.layers[4]

            def broken(*args):
                raise RuntimeError("a layer failed")

            layer.forward = broken
            with pytest.raises(RuntimeError, match="a layer failed"):
                trainer.step(x, y)
            dev.pool.reclaim(wait=True)
            assert dev.pool.snapshot() == before
    finally:
        dev.close()


def test_a_plan_that_does_not_fit_is_refused_before_anything_changes():
    from vmem.errors import OutOfDeviceMemory

    net = vmem.models.get("vgg_cifar")
    dev = vmem.device("cuda:0", math="exact", memory="64MiB")
    try:
        with vmem.Trainer(net, device=dev, policy="baseline", seed=0) as trainer:
            before = dev.pool.snapshot()
            with pytest.raises(OutOfDeviceMemory):
                trainer.step(np.zeros((256, 3, 32, 32), np.float32), np.zeros(256, int))
            assert dev.pool.snapshot() == before
    finally:
        dev.close()


def test_temporaries_can_be_routed_through_the_pool():
    net = vmem.models.get("vgg_cifar", image_size=16)
    dev = vmem.device("cuda:0", math="exact", memory="256MiB", temporaries="pool")
    try:
        with vmem.Trainer(net, device=dev, seed=0) as trainer:
            report = trainer.step(np.zeros((8, 3, 16, 16), np.float32), np.zeros(8, int))
            assert report.peak_bytes >= trainer.plans[8].peak_bytes
            assert dev.pool.stats().by_category["other"].peak > 0
    finally:
        dev.close()


def test_nvml_readings_are_sampled_into_the_step_timeline():
    from vmem.device.cuda import nvml

    if not nvml.available():
        pytest.skip("NVML is not available")
    net = vmem.models.get("vgg_cifar", image_size=16)
    dev = vmem.device("cuda:0", math="exact", memory="256MiB")
    try:
        deadline = time.monotonic() + 5  # NVML is read on a thread of its own: its first reading
        while not dev.readings() and time.monotonic() < deadline:
            time.sleep(0.01)
        with vmem.Trainer(net, device=dev, seed=0) as trainer:
            report = trainer.step(np.zeros((8, 3, 16, 16), np.float32), np.zeros(8, int))
        samples = report.timeline.samples
        assert len(samples) == 2 and all(r["used_bytes"] >= dev.pool.capacity for _, r in samples)
    finally:
        dev.close()


def test_vdnn_dyn_plans_from_a_profile_of_the_gpu():
    """The dynamic policy profiles every layer and cuDNN algorithm on the GPU (random data drawn there),
    chooses among the algorithms cuDNN offers, and its plan's peak is the pool's."""
    from vmem.device.cuda import cudnn

    params, reports, plan = train(MODELS["vgg_cifar"], "vdnn-dyn", steps=3)
    assert plan.fits and plan.chosen
    assert all(r.peak_bytes == plan.peak_bytes for r in reports)
    convs = {op: passes for op, passes in plan.plan.algos.items() if passes}
    assert convs, "no convolution algorithms in the plan"
    for passes in convs.values():
        for pass_, algo in passes.items():
            assert cudnn.unpair(algo)[0] in cudnn.ALGOS[pass_], (pass_, algo)  # an (algorithm, math type) pair
    assert all(np.isfinite(p).all() for p in params.values())


def test_the_step_timeline_is_timed_on_the_gpu():
    """Spans come from CUDA events read after the step: every op has one, in stream order, within the
    step; offloads and prefetches have theirs on the memory stream; the compute stream's waits too."""
    _, reports, plan = train(MODELS["vgg_cifar"], "vdnn-all", steps=3)
    r = reports[-1]
    timeline = r.timeline
    compute, memory = timeline.by_stream("compute"), timeline.by_stream("memory")
    assert timeline.waiting == [] and compute and memory
    origin, end = timeline.origin, timeline.origin + r.seconds
    assert all(origin <= s.start <= s.end <= end + 1e-3 for s in timeline.spans)
    assert all(later.start >= earlier.end - 1e-6 for earlier, later in zip(compute, compute[1:]))
    assert {s.kind for s in memory} == {"offload", "prefetch"} and any(s.kind == "wait" for s in compute)
    assert sum(s.seconds for s in compute) <= r.seconds + 1e-3


@pytest.mark.parametrize("policy", ["baseline", "vdnn-all"])
def test_a_tensor_stored_in_fp16_runs_on_the_gpu_at_the_planned_peak(policy):
    """A layer storing its output in float16 (the Program counts it at 2 bytes a value): on cuda:0 the step
    views it as float16, runs at exactly the planned peak and gives the fp32 network's weights within fp16
    rounding (tests/graph/test_precision.py does the same on the CPU device)."""
    from tests.graph.test_precision import step_half_and_full

    step_half_and_full(policy, lambda: vmem.device("cuda:0", math="exact", memory="64MiB", pinned_memory="16MiB"))


def test_half_precision_training_on_the_gpu_runs_at_the_planned_peak_and_follows_fp32():
    """Mixed precision on cuda:0: feature maps in fp16 or bf16; convolutions (cuDNN's pseudo-half, the
    weights read through half copies), the linear layer (cuBLAS, FP32 accumulation), ReLU, pooling and sums
    computed as stored, batch norm and the loss in float32 over staging copies; every step at its planned peak (gist's ssdc blocks
    too: an encoding larger than its block waits in host memory), lossless policies bitwise equal to the
    fp16 baseline, the weights and losses close to the fp32 run's."""
    x = np.random.default_rng(0).standard_normal((16, 3, 32, 32)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 10, 16)
    weights, losses = {}, {}
    runs = [("fp32", "baseline"), ("fp16", "baseline"), ("fp16", "vdnn-all"), ("fp16", "gist"), ("bf16", "baseline")]
    for precision, policy in runs:
        net = vmem.models.get("resnet_cifar", depth=8)
        dev = vmem.device("cuda:0", math="exact", memory="1GiB", pinned_memory="512MiB")
        try:
            with vmem.Trainer(net, device=dev, policy=policy, precision=precision, seed=0) as t:
                for _ in range(3):
                    report = t.step(x, y)
                    planned = t.plans[16].peak_bytes
                    assert np.isfinite(report.loss)
                    assert report.peak_bytes == planned
        finally:
            dev.close()
        weights[(precision, policy)], losses[(precision, policy)] = net.params, report.loss
    half = weights[("fp16", "baseline")]
    for key in (("fp16", "vdnn-all"), ("fp16", "gist")):
        assert all(np.array_equal(half[k], weights[key][k]) for k in half), key
    full = weights[("fp32", "baseline")]
    for precision, tol in (("fp16", 0.05), ("bf16", 0.1)):
        assert abs(losses[(precision, "baseline")] - losses[("fp32", "baseline")]) < tol, precision
        for k, w in full.items():
            np.testing.assert_allclose(weights[(precision, "baseline")][k], w, rtol=tol, atol=tol / 2, err_msg=k)


def test_nccl_runs_a_data_parallel_step_of_one_rank_with_its_allreduce_on_its_own_stream():
    """NCCL with world size 1 (issue 35): the bucketed all-reduce runs on the communication stream (the
    timeline's ``comm`` spans, one per bucket), and the weights are the single-process run's bit for bit
    (a sum over one rank, divided by one)."""
    from vmem.distributed import NCCLGroup

    ref, _, _ = train(MODELS["resnet_cifar"], "baseline")
    net = MODELS["resnet_cifar"]()
    dev = vmem.device("cuda:0", math="exact", memory="1GiB", pinned_memory="512MiB")
    group = NCCLGroup()
    try:
        with vmem.Trainer(net, device=dev, optimizer=SGD(lr=0.01, momentum=0.9), seed=0, group=group) as trainer:
            rng = np.random.default_rng(0)
            for _ in range(5):
                x = rng.standard_normal((16,) + net.input_shape).astype(np.float32)
                report = trainer.step(x, rng.integers(0, 10, 16))
    finally:
        group.close()
        dev.close()
    comm = [s for s in report.timeline.spans if s.stream == "comm"]
    assert comm and all(s.name.startswith("allreduce") for s in comm)
    assert all(np.array_equal(ref[k], net.params[k]) for k in ref)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_vgg_like_network_in_half_precision_profiles_and_follows_fp32(precision):
    """vgg_cifar (conv biases, 2x2 max pools, the bias gradient summed by vmem's column kernels) in half
    precision under auto, which profiles the GPU first (half inputs drawn in FP32, as CuPy's generator
    draws no half types): three steps at the planned peak, the losses and what the steps changed in each
    weight close to FP32's (at a learning rate where FP32 converges: at the zoo's default the loss climbs
    from 8 to 30 in three steps, and half precision's rounding is amplified as much; on the CPU device the
    same comparison gives 0.07 in the loss and 0.21 (bf16) and 0.12 (fp16) in the changes)."""
    x = np.random.default_rng(0).standard_normal((16, 3, 32, 32)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 10, 16)
    out = {}
    for prec, policy in (("fp32", "baseline"), (precision, "auto")):
        net = vmem.models.get("vgg_cifar")
        dev = vmem.device("cuda:0", math="exact", memory="1GiB", pinned_memory="512MiB")
        try:
            with vmem.Trainer(net, device=dev, policy=policy, precision=prec, seed=0, optimizer=SGD(lr=1e-3)) as t:
                start = {k: v.copy() for k, v in t.net.params.items()}
                losses = []
                for _ in range(3):
                    report = t.step(x, y)
                    assert np.isfinite(report.loss) and report.peak_bytes == t.plans[16].peak_bytes
                    losses.append(report.loss)
        finally:
            dev.close()
        out[prec] = {k: net.params[k] - start[k] for k in start}, losses
    (full, loss), (half, half_loss) = out["fp32"], out[precision]
    np.testing.assert_allclose(half_loss, loss, atol=0.15)
    bound = 0.35 if precision == "bf16" else 0.2
    for k, change in full.items():
        assert np.linalg.norm(half[k] - change) <= bound * np.linalg.norm(change), k


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_steps_replayed_as_cuda_graphs_give_the_bits_of_steps_without(precision):
    """graphs="on" on the GPU: the second step is captured, the rest replayed by one launch each, and the
    weights are those of the same steps without graphs, bit for bit (baseline and vdnn-all)."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    for policy in ("baseline", "vdnn-all"):
        results = {}
        for graphs in ("off", "on"):
            net = vmem.models.get("vgg_cifar").init(seed=0)
            dev = vmem.device("cuda:0", math="exact", memory="1GiB", graphs=graphs)
            try:
                opt = SGD(lr=0.01, momentum=0.9)
                with vmem.Trainer(net, device=dev, policy=policy, optimizer=opt, seed=0, precision=precision) as t:
                    rng = np.random.default_rng(0)
                    x = rng.standard_normal((16,) + net.input_shape).astype(np.float32)
                    y = rng.integers(0, 10, 16)
                    reports = [t.step(x, y) for _ in range(5)]
                    t.sync()
            finally:
                dev.close()
            results[graphs] = ({k: v.copy() for k, v in net.params.items()}, [r.graph for r in reports])
        (want, _), (got, kinds) = results["off"], results["on"]
        assert kinds == ["", "captured", "replayed", "replayed", "replayed"], (policy, kinds)
        assert all(np.array_equal(want[k], got[k]) for k in want), f"{policy}: graphs changed the weights"
