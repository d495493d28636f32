"""A convolution's backward split in two steps (``Plan.split``, a policy's ``split=on``): backward-filter, the
input freed where nothing later reads it, then backward-data. The layer holds x + dy, then dy + dx, never
all three; the weights are those of the unsplit step bit for bit, and the measured peak is the plan's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.costs import Roofline
from vmem.schedule import steps as S
from vmem.schedule.lower import lower
from vmem.schedule.replay import durations
from tests.lossless import all_equal, weights_under

SPEC = dataclasses.replace(vmem.device("sim:titan-x").spec, memory=1 << 34)


def _net() -> vmem.Sequential:
    """conv2's input is the pooling's output, which only conv2's backward reads: the split frees it."""
    return vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 10),
        input_shape=(3, 16, 16),
        name="splitnet",
    )


def _batch(n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, n)


def _schedule(policy: str, batch: int = 4):
    program = vmem.device("cpu", memory="64MiB").catalog(_net().build(batch))
    return program, lower(program, vmem.policies.get(policy).decide(program, SPEC))


def test_the_backward_runs_filter_then_data_with_the_input_freed_between():
    program, schedule = _schedule("vdnn-all:split=on")
    conv2 = next(op for op in program.ops if op.name == "conv2")
    steps = schedule.steps
    parts = [(i, st.part) for i, st in enumerate(steps) if type(st) is S.Backward and st.op == conv2.index]
    assert [p for _, p in parts] == ["filter", "data"]
    (f, _), (d, _) = parts
    between = steps[f + 1 : d]
    x = schedule.value[conv2.inputs[0]]
    dx = schedule.grad[conv2.inputs[0]]
    assert any(type(st) is S.Free and st.key == x for st in between)  # the input, once its filters' gradient is made
    assert any(type(st) is S.Alloc and st.buffer.key == dx for st in between)  # its gradient, only then
    # conv1's input (the network's) needs no gradient: one step, nothing to split
    conv1 = next(op for op in program.ops if op.name == "conv1")
    assert [st.part for st in steps if type(st) is S.Backward and st.op == conv1.index] == ["all"]


def test_unsplit_policies_keep_one_backward_step():
    _, schedule = _schedule("vdnn-all")
    assert {st.part for st in schedule.steps if type(st) is S.Backward} == {"all"}


def test_the_split_lowers_the_peak_of_a_convolutions_backward_by_its_input():
    """Layer-wise, without offloads: at conv2's backward x, dy and dx are live unsplit; split, at most two."""
    batch = 64
    program = vmem.device("cpu", memory="64MiB").catalog(_net().build(batch))
    conv2 = next(op for op in program.ops if op.name == "conv2")
    figures = {}
    for policy in ("layerwise:algos=memory", "layerwise:algos=memory,split=on"):
        result = vmem.plan(_net(), batch, "cpu", policy, memory="1GiB")
        figures[policy] = result.layer_peaks[conv2.name]
    unsplit, split = figures.values()
    x = program.tensors[conv2.inputs[0]].nbytes
    assert split <= unsplit - x + 4096  # the input's bytes (to the pool's alignment) less at that layer


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_split_plans_give_the_unsplit_weights_bit_for_bit(precision):
    x, y = _batch()
    policies = ("baseline", "layerwise:split=on", "vdnn-all:split=on", "gist:split=on", "vdnn-conv:split=on")
    assert all_equal(weights_under(_net, policies, x, y, precision=precision))


def test_each_half_is_priced_as_its_pass():
    program, split = _schedule("layerwise:split=on")
    _, whole = _schedule("layerwise")
    costs = Roofline(vmem.device("sim:titan-x").spec)

    def backward_seconds(schedule) -> dict[int, float]:
        out: dict[int, float] = {}
        for st, t in zip(schedule.steps, durations(schedule, costs)):
            if type(st) is S.Backward:
                out[st.op] = out.get(st.op, 0.0) + t
        return out

    assert backward_seconds(split) == pytest.approx(backward_seconds(whole))


def test_auto_splits_by_default_and_says_so_only_when_off():
    auto = vmem.policies.get("auto")
    assert auto.split == "on" and auto.spec == "auto"
    off = vmem.policies.get("auto:split=off")
    assert off.split == "off" and off.spec == "auto:split=off"
    assert vmem.policies.get("vdnn-all").split == "off"  # the named policies keep the papers' one step
    with pytest.raises(ValueError, match="split"):
        vmem.policies.get("vdnn-all:split=maybe")
