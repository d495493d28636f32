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


def _relu_net() -> vmem.Sequential:
    """conv2 reads relu1's output, which relu1's backward reads again for its sign."""
    return vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
        input_shape=(3, 16, 16),
        name="relunet",
    )


def test_a_split_keeps_the_sign_of_its_input_for_the_relu_that_reads_it_later():
    program = vmem.device("cpu", memory="64MiB").catalog(_relu_net().build(4))
    schedule = lower(program, vmem.policies.get("layerwise:split=on").decide(program, SPEC))
    steps = schedule.steps
    conv2 = next(op for op in program.ops if op.name == "conv2")
    relu1 = next(op for op in program.ops if op.name == "relu1")
    x = schedule.value[conv2.inputs[0]]
    f = next(i for i, st in enumerate(steps) if type(st) is S.Backward and st.op == conv2.index and st.part == "filter")
    d = next(i for i, st in enumerate(steps) if type(st) is S.Backward and st.op == conv2.index and st.part == "data")
    encode = next(i for i, st in enumerate(steps) if type(st) is S.Encode and st.key == x)
    free = next(i for i, st in enumerate(steps) if type(st) is S.Free and st.key == x)
    assert f < encode < free < d  # its bits made, then the values freed, before the input's gradient
    relu = next(st for st in steps if type(st) is S.Backward and st.op == relu1.index)
    assert relu.on_bits == steps[encode].enc
    assert any(type(st) is S.Free and st.key == relu.on_bits for st in steps[d:])


def test_signs_on_the_host_are_made_in_the_forward_and_come_back_after_the_split():
    """``signs=host``: relu1's bits are made once relu1 has written its output, sent to the host and their
    block released, all in the forward; they come back after conv2's backward-data, so that conv2's backward
    holds x + dy, then dy + dx, and never the bits beside them."""
    program = vmem.device("cpu", memory="64MiB").catalog(_relu_net().build(4))
    plan = vmem.policies.get("vdnn-all:relu=bits,prefetch=after,split=on,signs=host").decide(program, SPEC)
    conv2 = next(op for op in program.ops if op.name == "conv2")
    relu1 = next(op for op in program.ops if op.name == "relu1")
    x = program.tensors[program.tensors[conv2.inputs[0]].buffer]  # relu1 writes over conv1's output
    assert plan.signs == (x.name,)
    schedule = lower(program, plan)
    steps = schedule.steps
    loss = next(i for i, st in enumerate(steps) if type(st) is S.Loss)
    relu = next(i for i, st in enumerate(steps) if type(st) is S.Backward and st.op == relu1.index)
    sign = steps[relu].on_bits
    assert sign is not None and sign.part == "sign"
    made = next(i for i, st in enumerate(steps) if type(st) is S.Encode and st.enc == sign)
    sent = next(i for i, st in enumerate(steps) if type(st) is S.Offload and st.key == sign)
    released = next(i for i, st in enumerate(steps) if type(st) is S.Release and st.key == sign)
    back = next(i for i, st in enumerate(steps) if type(st) is S.Prefetch and st.key == sign)
    waited = next(i for i, st in enumerate(steps) if type(st) is S.WaitPrefetch and st.key == sign)
    data = next(
        i for i, st in enumerate(steps) if type(st) is S.Backward and st.op == conv2.index and st.part == "data"
    )
    conv2_forward = next(i for i, st in enumerate(steps) if type(st) is S.Forward and st.op == conv2.index)
    assert made < sent < released < conv2_forward < loss < data < back < waited < relu
    allocs = [i for i, st in enumerate(steps) if type(st) is S.Alloc and st.buffer.key == sign]
    frees = [i for i, st in enumerate(steps) if type(st) is S.Free and st.key == sign]
    assert allocs == [made - 1, back - 1] and len(frees) == 1 and frees[0] > relu
    # no Encode of conv2's input at the split: its values are just freed
    assert not any(type(st) is S.Encode and st.enc == sign for st in steps[loss:])


def test_auto_sends_signs_to_the_host_only_where_it_needs_to():
    """The bits' copies cost time: a budget with room keeps them on the device, VGG-16's largest batch in
    8 GiB (the simulator's) needs them on the host."""
    roomy = vmem.plan(_relu_net(), 4, "sim:titan-x", "auto", memory="1GiB")
    assert roomy.fits and roomy.plan.signs == ()
    net = vmem.models.get("vgg16")
    tight = vmem.plan(net, 269, "sim:h100-sxm", "auto:microbatch=off", memory="8GiB")
    assert tight.fits and "conv1" in tight.plan.signs
    device = vmem.plan(
        net, 269, "sim:h100-sxm", "vdnn-all:algos=memory,relu=bits,prefetch=after,split=on", memory="8GiB"
    )
    assert not device.fits


@pytest.mark.parametrize("make", [_net, _relu_net])
def test_lean_plans_give_the_baselines_weights_bit_for_bit(make):
    x, y = _batch()
    policies = (
        "baseline",
        "layerwise:split=on",
        "vdnn-all:relu=bits",
        "vdnn-all:prefetch=after",
        "vdnn-all:relu=bits,prefetch=after,split=on",
        "vdnn-all:relu=bits,prefetch=after,split=on,signs=host",
        "vdnn-conv:relu=bits,prefetch=after,split=on,sync=event",
        "vdnn-conv:relu=bits,prefetch=after,split=on,sync=event,signs=host",
    )
    assert all_equal(weights_under(make, policies, x, y))


def test_signs_on_the_host_in_bf16_give_the_baselines_weights_bit_for_bit():
    x, y = _batch()
    policies = ("baseline", "vdnn-all:relu=bits,prefetch=after,split=on,signs=host")
    assert all_equal(weights_under(_relu_net, policies, x, y, precision="bf16"))


def test_relu_bits_keep_on_the_device_the_sign_of_what_only_a_relu_reads():
    program = vmem.device("cpu", memory="64MiB").catalog(_net().build(4))
    plan = vmem.policies.get("vdnn-all:relu=bits").decide(program, SPEC)
    signs = {t.name for t in program.tensors if t.id in program.stashed_buffers() and program.sign_only(t.id)}
    assert signs and all(plan.stash[n] == "encode" and plan.codecs[n] == "binarize" for n in signs)
    assert all(plan.stash[n] == "offload" for n in plan.stash if n not in signs)
    paper = vmem.policies.get("vdnn-all").decide(program, SPEC)
    assert all(d == "offload" for d in paper.stash.values())  # unless asked, the paper's behaviour


def test_prefetch_after_issues_each_copy_at_its_first_readers_backward():
    program = vmem.device("cpu", memory="64MiB").catalog(_net().build(4))
    ahead = vmem.policies.get("vdnn-all").decide(program, SPEC)
    after = vmem.policies.get("vdnn-all:prefetch=after").decide(program, SPEC)
    assert sorted(b for bs in ahead.prefetch.values() for b in bs) == sorted(
        b for bs in after.prefetch.values() for b in bs
    )
    readers = {op.name: {program.tensors[b].name for b in program.backward_reads(op)} for op in program.ops}
    assert all(set(bs) <= readers[op] for op, bs in after.prefetch.items())
    assert any(not set(bs) <= readers[op] for op, bs in ahead.prefetch.items())  # vDNN's look-ahead
