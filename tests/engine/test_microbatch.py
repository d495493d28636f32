"""A step that fits under none of a policy's plans, run as micro-batches (``microbatch=on``; auto's default):
the weights equal the whole batch's within float rounding, the measured peak is the plan's, and the planner
takes the fewest micro-batches that fit."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.planning.microbatch import per_sample, slice_sizes, splittable, sums_passes

#: a micro-batched step's weights against the whole batch's after 5 steps (FP32): the gradients are summed
#: micro-batch by micro-batch, each loss gradient weighed by its share, so only rounding differs
TOLERANCE = 1e-5


def _net(norm: bool = False) -> vmem.Sequential:
    return vmem.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        *([nn.BatchNorm2d(16)] if norm else []),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        *([nn.BatchNorm2d(16)] if norm else []),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
        input_shape=(3, 16, 16),
        name="micronet",
    )


def _batches(n: int, steps: int = 5):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((n, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, n)) for _ in range(steps)]


def _train(policy: str, memory: str, batch: int = 48, norm: bool = False):
    net = _net(norm)
    reports = []
    with vmem.Trainer(net, device="cpu", memory=memory, policy=policy, seed=0) as trainer:
        for x, y in _batches(batch):
            reports.append(trainer.step(x, y))
        plan = trainer.plans[batch]
    return net.params, reports, plan


def _close(split: dict, whole: dict) -> None:
    """Each parameter within TOLERANCE of its layer's largest weight (a bias before a batch norm has no
    gradient but rounding: it is compared at its layer's scale)."""
    for k in whole:
        layer = k.rsplit(".", 1)[0]
        scale = max(np.abs(whole[j]).max() for j in whole if j.rsplit(".", 1)[0] == layer) or 1.0
        assert np.abs(split[k] - whole[k]).max() <= TOLERANCE * scale, k


def test_slices_are_equal_then_the_rest():
    assert slice_sizes(10, 4) == (4, 4, 2) and slice_sizes(8, 4) == (4, 4) and slice_sizes(5, 5) == (5,)
    with pytest.raises(ValueError):
        slice_sizes(4, 0)


def test_only_networks_that_treat_each_sample_alone_are_micro_batched():
    assert per_sample(_net().build(2))
    resnet = vmem.models.get("resnet18", num_classes=10, image_size=32).build(2)
    assert not per_sample(resnet) and splittable(resnet)  # batch norm: its sums over the whole batch
    assert len(sums_passes(resnet)) == 3 * sum(op.kind == "batchnorm" for op in resnet.ops)


def test_a_micro_batched_step_trains_as_the_whole_batch_does_in_less_memory():
    whole, _, big = _train("vdnn-all:algos=memory", "256MiB")
    assert big.microbatch == 1
    budget = int(big.peak_bytes * 0.7)  # below vdnn-all's leanest plan of the whole batch
    with pytest.raises(vmem.errors.VmemError):
        _train("vdnn-all:algos=memory", f"{budget}B")
    split, reports, plan = _train("vdnn-all:algos=memory,microbatch=on", f"{budget}B")
    assert plan.microbatch >= 2 and plan.fits and plan.peak_bytes <= budget
    assert all(r.peak_bytes == plan.peak_bytes for r in reports)  # measured as planned, every step
    assert all(np.isfinite(r.loss) and not r.skipped for r in reports)
    _close(split, whole)


def test_batch_norm_keeps_the_whole_batchs_statistics_over_micro_batches():
    """Statistics passes find each batch norm's sums over the whole batch first: the weights and the running
    statistics after 5 steps equal the whole batch's within rounding."""
    whole, _, big = _train("vdnn-all:algos=memory", "256MiB", norm=True)
    budget = int(big.peak_bytes * 0.7)
    split, reports, plan = _train("vdnn-all:algos=memory,microbatch=on", f"{budget}B", norm=True)
    assert plan.microbatch >= 2 and plan.fits and "statistics passes" in plan.reason
    assert all(r.peak_bytes <= plan.peak_bytes for r in reports) and reports[-1].peak_bytes == plan.peak_bytes
    assert all(r.seconds > 0 and np.isfinite(r.loss) for r in reports)
    assert {k for k in whole if "running" in k} == {
        f"{b}.running_{s}" for b in ("batchnorm1", "batchnorm2") for s in ("mean", "var")
    }
    _close(split, whole)


def test_split_convolutions_add_their_weight_gradients_in_later_micro_batches():
    """A split backward's filter half writes into the temporary a later micro-batch adds from; its data half
    makes no weight gradient."""
    whole, _, big = _train("vdnn-all:algos=memory,split=on", "256MiB")
    budget = int(big.peak_bytes * 0.7)
    split, reports, plan = _train("vdnn-all:algos=memory,split=on,microbatch=on", f"{budget}B")
    assert plan.microbatch >= 2 and all(r.peak_bytes == plan.peak_bytes for r in reports)
    _close(split, whole)


def test_vmem_plan_says_how_many_micro_batches(capsys):
    import json

    from vmem.cli import main

    code = main(
        ["plan", "--model", "vgg16", "--batch", "512", "--device", "sim:h100-sxm", "--memory", "8GiB", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["fits"] and out["microbatch"] == 2 and out["baseline_step_seconds"] > 0
    assert out["step_seconds"] > out["baseline_step_seconds"]  # two micro-batches, each through the link


def test_an_imported_bert_trains_as_micro_batches_as_the_whole_batch_does():
    """Embeddings, layer norms, attention's batched products and softmax, GELU: each per sample, so a
    transformer micro-batches too (a BERT exported by PyTorch, from the ONNX corpus)."""
    from pathlib import Path

    pytest.importorskip("onnx")
    path = Path(__file__).resolve().parents[1] / "onnx" / "corpus" / "bert_opset17.onnx"
    rng = np.random.default_rng(0)
    ids, types = rng.integers(0, 20, (256, 6)), np.repeat([[0, 0, 0, 1, 1, 1]], 256, axis=0)
    mask = np.ones((256, 6), np.int64)
    mask[::3, 4:] = 0  # every third sequence padded

    def train(policy: str, memory: str):
        net = vmem.onnx.load(path)
        with vmem.Trainer(net, device="cpu", memory=memory, policy=policy, seed=0) as trainer:
            reports = [trainer.step((ids, types, mask), rng_labels) for rng_labels in labels]
            return net.params, reports, trainer.plans[256]

    labels = [np.random.default_rng(s).integers(0, 3, 256) for s in range(5)]
    whole, _, big = train("layerwise", "256MiB")
    split, reports, plan = train("layerwise:microbatch=on", f"{int(big.peak_bytes * 0.7)}B")
    assert plan.microbatch >= 2 and all(r.peak_bytes == plan.peak_bytes for r in reports)
    _close(split, whole)


def test_statistics_passes_leave_the_pool_and_pinned_memory_as_they_found_them():
    """Each statistics pass stops its micro-batches midway (their blocks and pinned buffers given back): after
    a step the device holds what it held before it."""
    _, _, big = _train("vdnn-all:algos=memory", "256MiB", batch=24, norm=True)
    net = _net(norm=True)
    (x, y), later = _batches(24, 2)
    with vmem.Trainer(
        net, device="cpu", memory=f"{int(big.peak_bytes * 0.7)}B", policy="vdnn-all:algos=memory,microbatch=on", seed=0
    ) as trainer:
        trainer.step(x, y)
        dev = trainer.device
        held = (dev.pool.stats().in_use, dev.pinned.stats().in_use)
        report = trainer.step(*later)
        assert trainer.plans[24].microbatch >= 2 and np.isfinite(report.loss)
        assert (dev.pool.stats().in_use, dev.pinned.stats().in_use) == held


def test_a_micro_batched_plans_reason_gives_the_whole_steps_predicted_time():
    """The reason line ends with the step the user gets (it gave one micro-batch's time: 24 ms for a step
    measured at 4.7 s)."""
    import re

    net = vmem.models.get("vgg16")
    result = vmem.plan(net, 256, "sim:titan-x", "auto", memory="2GiB")
    assert result.plan.microbatch > 1
    said = re.search(r"the whole step ([0-9.]+) ms predicted\.$", result.plan.reason)
    assert said and float(said.group(1)) == pytest.approx(result.step_seconds * 1e3, abs=0.01)
    assert "(each micro-batch)" in result.plan.reason
