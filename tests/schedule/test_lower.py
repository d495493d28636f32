"""The lowering on its own: typed steps, everything the executor needs resolved, and every consumer's
handler table covering every step kind."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.schedule import steps as S
from vmem.schedule.lower import lower, lower_inference
from vmem.schedule.pack import lifetimes
from tests.lossless import all_equal, weights_under

SPEC = vmem.device("sim:titan-x").spec
POLICIES = [
    "baseline",
    "baseline:algos=performance",
    "vdnn-all",
    "vdnn-conv:sync=event",
    "vdnn-all:codec=zvc",
    "gist",
    "gist:dpr=fp8",
    "vdnn-all:codec=fixed8",
]


def lowered(net, policy, batch=4):
    program = net.build(batch)
    plan = vmem.policies.get(policy).decide(program, SPEC)
    return program, plan, lower(program, plan)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model", ["vgg_cifar", "resnet_cifar", "mini_googlenet"])
def test_every_block_is_allocated_before_use_and_released_once(model, policy):
    program, plan, schedule = lowered(vmem.models.get(model, image_size=16), policy)
    live: set = set()
    for st in schedule.steps:
        if type(st) is S.Alloc:
            assert st.buffer.key not in live and st.offset is not None
            live.add(st.buffer.key)
        elif type(st) in S.RELEASES:
            live.remove(st.key)
        elif type(st) in (S.Upload, S.Prefetch, S.Encode, S.Decode, S.WaitPrefetch):
            assert st.key in live, st
    assert not live, "everything allocated in a step is released in it"
    assert len(lifetimes(schedule.steps, 256)) == sum(type(st) is S.Alloc for st in schedule.steps)


@pytest.mark.parametrize("policy", ["vdnn-all", "vdnn-conv:sync=event,codec=zvc"])
def test_offloads_are_resolved_and_come_back_before_they_are_read(policy):
    program, plan, schedule = lowered(vmem.models.get("vgg_cifar", image_size=16), policy)
    steps = schedule.steps
    offloads = {st.key: i for i, st in enumerate(steps) if type(st) is S.Offload}
    assert {k.name for k in offloads} == {n for n, d in plan.stash.items() if d == "offload"}
    for i, st in enumerate(steps):
        if type(st) is S.Offload:
            assert (st.codec is None) == (plan.codecs.get(st.key.name) is None)
            after = range(i, len(steps))
            release = next(j for j in after if type(steps[j]) is S.Release and steps[j].key == st.key)
            prefetch = next(j for j in after if type(steps[j]) is S.Prefetch and steps[j].key == st.key)
            wait = next(j for j in after if type(steps[j]) is S.WaitPrefetch and steps[j].key == st.key)
            assert i < release < prefetch < wait and steps[release].sync == plan.sync
    assert schedule.pinned_bytes == sum(-(-st.host_nbytes // 256) * 256 for st in steps if type(st) is S.Offload)
    for st in steps:
        if type(st) is S.Forward and program.ops[st.op].algorithms:
            assert st.algo == plan.algos[program.ops[st.op].name]["forward"]


@pytest.mark.parametrize("model", ["vgg_cifar", "resnet_cifar", "mini_googlenet"])
def test_an_offload_starts_after_the_last_write_and_overlaps_only_reads(model):
    """The rule of vmem.schedule.layerwise: a copy starts once its buffer holds what backward reads, and
    between the start and the release no forward writes the buffer (an in-place layer included), while
    at least one reads it (the overlap)."""
    program, plan, schedule = lowered(vmem.models.get(model, image_size=16), "vdnn-all")
    owner = {op.index: program.tensors[program.tensors[op.output].buffer].name for op in program.ops}
    reads = {op.index: {program.tensors[program.tensors[t].buffer].name for t in op.inputs} for op in program.ops}
    steps = schedule.steps
    overlapped = 0
    for i, st in enumerate(steps):
        if type(st) is not S.Offload:
            continue
        j = next(j for j in range(i, len(steps)) if type(steps[j]) is S.Release and steps[j].key == st.key)
        forwards = [steps[k].op for k in range(i, j) if type(steps[k]) is S.Forward]
        assert all(owner[o] != st.key.name for o in forwards), f"{st.key} written while it is copied"
        assert all(st.key.name in reads[o] for o in forwards[-1:])  # released after its last reader
        writers = [op.index for op in program.ops if owner[op.index] == st.key.name]
        before = [steps[k].op for k in range(i) if type(steps[k]) is S.Forward]
        assert all(w in before for w in writers), f"{st.key} copied before its last write"
        overlapped += bool(forwards)
    assert overlapped > 0


def test_gist_encodes_after_the_forward_and_reads_bits_without_decoding():
    program, plan, schedule = lowered(vmem.models.get("vgg_cifar", image_size=16), "gist")
    encoded = {st.key.name for st in schedule.steps if type(st) is S.Encode}
    decoded = {st.key.name for st in schedule.steps if type(st) is S.Decode}
    binarized = {n for n, c in plan.codecs.items() if c == "binarize"}
    assert encoded == set(plan.codecs) and decoded == encoded - binarized
    on_bits = {program.ops[st.op].name for st in schedule.steps if type(st) is S.Backward and st.on_bits}
    assert on_bits and all(
        program.ops[i].kind == "relu" for i in range(len(program.ops)) if program.ops[i].name in on_bits
    )


def test_inference_copies_the_logits_right_after_the_last_forward():
    net = vmem.models.get("digits_cnn")
    program = net.build(4)
    schedule = lower_inference(program, vmem.policies.get("baseline").decide(program, SPEC))
    kinds = [type(st) for st in schedule.steps]
    last = max(i for i, k in enumerate(kinds) if k is S.Forward)
    assert kinds[last + 1] is S.CopyOut and not schedule.training
    assert S.Backward not in kinds and S.Update not in kinds


def test_a_network_that_ends_in_an_in_place_flatten_keeps_its_logits_until_the_loss():
    """The logits' buffer is an earlier layer's (Flatten writes over AvgPool's output): the forward must
    not release it before the loss reads it (it once did, under every layer-wise policy)."""

    def make():
        return vmem.Sequential(
            nn.Conv2d(3, 10, 3, padding=1), nn.ReLU(), nn.AvgPool2d(8), nn.Flatten(), input_shape=(3, 8, 8)
        )

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 4)
    assert all_equal(weights_under(make, ("baseline", "vdnn-all", "gist"), x, y))


class NewStep:
    """A step kind no consumer knows."""


def test_a_consumer_without_a_handler_for_a_step_kind_fails_loudly(monkeypatch):
    from vmem.runtime import executor as ex_module
    from vmem.schedule import replay as replay_module

    with pytest.raises(TypeError, match="missing"):
        S.handlers({S.Alloc: None}, "partial")
    monkeypatch.setattr(S, "STEPS", S.STEPS + (NewStep,))
    program, plan, schedule = lowered(vmem.models.get("digits_cnn"), "baseline")
    with pytest.raises(TypeError, match="NewStep"):
        replay_module.replay(schedule, vmem.device("sim:titan-x", memory="1GiB"))
    dev = vmem.device("cpu", memory="16MiB")
    try:
        with pytest.raises(TypeError, match="NewStep"):
            ex_module.Executor(dev, schedule, params=_params(dev, schedule))
    finally:
        dev.close()


def _params(dev, schedule):
    from vmem.runtime import DeviceParams

    specs = {f"{op.name}.{k}": s for op in schedule.program.ops for k, s in op.params.items()}
    return DeviceParams(dev, schedule.persistent, specs, "float32")


def test_plans_are_frozen():
    _, plan, _ = lowered(vmem.models.get("digits_cnn"), "vdnn-all")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.sync = "event"


class HeldOffloads(vmem.policies.Policy):
    """vdnn-all with sync=event, every offloaded block released only after the last forward layer."""

    name = "vdnn-all-held"

    def decide(self, program, device, costs=None, oracle=None):
        plan = vmem.policies.get("vdnn-all:sync=event").decide(program, device, costs)
        last = program.ops[-1].name
        return dataclasses.replace(plan, release={n: last for n, d in plan.stash.items() if d == "offload"})


def test_a_release_the_plan_names_holds_the_block_until_that_layer_and_trains_the_same():
    """``Plan.release``: the block of an offload whose copy outlasts its readers stays allocated (counted)
    until the forward of the layer named, then is released as usual; the weights do not change."""
    net = vmem.models.get("vgg_cifar", image_size=16)
    program = net.build(4)
    held = HeldOffloads().decide(program, SPEC)
    schedule = lower(program, held)
    steps = schedule.steps
    last_forward = max(i for i, st in enumerate(steps) if type(st) is S.Forward)
    releases = [i for i, st in enumerate(steps) if type(st) is S.Release]
    assert releases and all(i > last_forward for i in releases)  # after the last layer's forward
    plain = lower(program, vmem.policies.get("vdnn-all:sync=event").decide(program, SPEC))
    held_for = lambda s: sum(life.size * (life.end - life.start) for life in lifetimes(s.steps, 256))  # noqa: E731
    assert held_for(schedule) > held_for(plain)  # the held blocks are counted while they are held
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 1, 16, 16)).astype(np.float32), rng.integers(0, 10, 4)
    make = lambda: vmem.models.get("digits_vgg")  # noqa: E731
    assert all_equal(weights_under(make, ("baseline", HeldOffloads()), x, y))


def test_a_release_naming_no_offload_or_no_layer_is_refused():
    program = vmem.models.get("digits_cnn").build(4)
    plan = vmem.policies.get("vdnn-all:sync=event").decide(program, SPEC)
    offloaded = next(n for n, d in plan.stash.items() if d == "offload")
    with pytest.raises(vmem.errors.PlanError, match="which the plan does not offload"):
        lower(program, dataclasses.replace(plan, release={"no-such-buffer": program.ops[-1].name}))
    with pytest.raises(vmem.errors.PlanError, match="'nowhere', which is no layer"):
        lower(program, dataclasses.replace(plan, release={offloaded: "nowhere"}))


def test_lowering_one_program_under_many_plans_gives_what_a_fresh_program_gives():
    """What the lowering derives from a Program alone is made once and kept with it (gradients' live
    ranges, buffer keys, ...); the lowerings that change their copies (the loss writing over the logits)
    must leave it as it was for the next one."""
    net = vmem.models.get("resnet_cifar", image_size=16)
    program = net.build(4)
    policies = [*POLICIES, "echo", "baseline"]
    for policy in policies:
        plan = vmem.policies.get(policy).decide(program, SPEC)
        fresh = net.build(4)
        again, first = lower(program, plan), lower(fresh, plan)
        assert repr(again.steps) == repr(first.steps) and again.grad == first.grad, policy  # codecs: by repr
        assert again.persistent == first.persistent and again.live_bytes == first.live_bytes
    assert program.derived("anything", lambda: [1]) is program.derived("anything", lambda: [2])


def test_a_relu_over_a_convolutions_output_runs_in_the_convolution():
    """Schedule.fused_relu: each ReLU written in place over a convolution's output (the convolution's only
    reader) is run by the convolution, after its bias; a ReLU over a map that another layer reads too, or
    over a batch norm's output, is not."""
    program, _, schedule = lowered(vmem.models.get("vgg_cifar"), "vdnn-all")
    convs = [op.index for op in program.ops if op.kind == "conv"]
    assert sorted(schedule.fused_relu) == convs
    for conv, relu in schedule.fused_relu.items():
        assert program.ops[relu].kind == "relu" and program.ops[relu].inputs == [program.ops[conv].output]
    g = vmem.Graph(input_shape=(3, 8, 8))
    c = g.add(nn.Conv2d(3, 4, 3, padding=1), g.input)
    g.add(nn.Add(), g.add(nn.ReLU(), c), c)  # the convolution's output read twice: the ReLU cannot overwrite it
    assert lowered(g, "baseline")[2].fused_relu == {}
    bn = vmem.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), input_shape=(3, 8, 8))
    assert lowered(bn, "baseline")[2].fused_relu == {}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_max_pool_over_a_relu_runs_the_relus_backward(monkeypatch, precision):
    """Schedule.fused_pool_relu: a max pool whose only input is an in-place ReLU's output runs that ReLU's
    backward in its own, where the ReLU's output stays on the device (not offloaded, encoded or
    recomputed); the weights are those of the two backwards run apart, bit for bit, in fp32 and bf16."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    program, _, schedule = lowered(vmem.models.get("vgg_cifar"), "baseline")
    pools = [op.index for op in program.ops if op.kind == "maxpool"]
    assert sorted(schedule.fused_pool_relu) == pools
    for pool, relu in schedule.fused_pool_relu.items():
        assert program.ops[relu].kind == "relu" and program.ops[pool].inputs == [program.ops[relu].output]
    offloaded = lowered(vmem.models.get("vgg_cifar"), "vdnn-all")[2]
    assert offloaded.fused_pool_relu == {}  # every ReLU's output is offloaded: it is not there for the pool
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 4)

    def make():
        return vmem.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2),  # overlapping windows: NumPy's path
            nn.Flatten(), nn.Linear(8, 10), input_shape=(3, 8, 8),
        ).init(seed=0)  # fmt: skip

    assert len(lowered(make(), "baseline")[2].fused_pool_relu) == 2
    fused = weights_under(make, ["baseline"], x, y, precision=precision)["baseline"]
    monkeypatch.setattr(S.Schedule, "fused_pool_relu", property(lambda self: {}))
    apart = weights_under(make, ["baseline"], x, y, precision=precision)["baseline"]
    assert all(np.array_equal(fused[k], apart[k]) for k in fused)
