"""Recomputation: rebuilds in the schedule, bitwise-exact replays (dropout masks, batch-norm statistics), the
policies (mirror, chen, echo), invalid plans, and recompute composed with offload and encodings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import PlanError
from vmem.schedule.lower import lower
from vmem.schedule.steps import Free, Key, Kind, Recompute

from tests.lossless import all_equal, weights_under

RECOMPUTE = ("mirror", "chen", "echo")


def bn_dropout_net():
    """Convolutions with batch norm and ReLU, dropout between them, a join, and a classifier."""
    g = vmem.Graph(input_shape=(3, 8, 8), name="bn_dropout")
    a = g.add(nn.Conv2d(3, 8, 3, padding=1), g.input)
    a = g.add(nn.BatchNorm2d(8), a)
    a = g.add(nn.ReLU(), a)
    a = g.add(nn.Dropout(0.3), a)
    b = g.add(nn.Conv2d(8, 8, 3, padding=1), a)
    b = g.add(nn.BatchNorm2d(8), b)
    b = g.add(nn.ReLU(), b)
    c = g.add(nn.Add(), a, b)
    c = g.add(nn.MaxPool2d(2), c)
    c = g.add(nn.Dropout(0.2), c)
    c = g.add(nn.Flatten(), c)
    g.add(nn.Linear(8 * 4 * 4, 10), c)
    return g


def batch(shape, n=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n,) + shape).astype(np.float32), rng.integers(0, 10, n)


@pytest.mark.parametrize(
    "make",
    [bn_dropout_net, lambda: vmem.models.get("resnet_cifar", depth=8, image_size=8)],
    ids=["bn_dropout", "resnet_cifar"],
)
def test_recompute_policies_are_bitwise_lossless(make):
    """Weights and batch-norm running statistics equal baseline's after 5 steps; each step's peak is the plan's."""
    x, y = batch(make().input_shape)
    weights = weights_under(make, ("baseline",) + RECOMPUTE, x, y, steps=5)
    assert all_equal(weights)
    assert any("running_mean" in k for k in weights["baseline"])


@pytest.mark.parametrize("policy", RECOMPUTE)
def test_recompute_plans_rebuild_buffers_and_use_less_memory(policy):
    net = bn_dropout_net()
    plan = vmem.plan(net, 32, policy=policy)
    base = vmem.plan(net, 32, policy="layerwise")
    schedule = lower(net.build(32), plan.plan)
    rebuilt = [st for st in schedule.steps if type(st) is Recompute]
    assert rebuilt and any(d == "recompute" for d in plan.stash.values())
    assert plan.peak_bytes <= base.peak_bytes and plan.average_bytes < base.average_bytes
    # every recomputed buffer is freed in forward and allocated again in backward
    for name, d in plan.stash.items():
        if d == "recompute":
            frees = [i for i, st in enumerate(schedule.steps) if type(st) is Free and st.key == Key(Kind.VALUE, name)]
            assert len(frees) == 2, name


def test_a_rebuild_whose_source_is_not_live_is_refused():
    net = bn_dropout_net()
    plan = vmem.plan(net, 4, policy="mirror").plan
    program = net.build(4)
    # conv2 feeds a rebuilt batch norm; say nothing about it (it is stashed: kept) -> fine; but drop a source
    # that no backward reads and that mirror had to keep
    stashed = {program.tensors[b].name for b in program.stashed_buffers()}
    sources = [n for n, d in plan.stash.items() if d == "keep" and n not in stashed]
    stash = dict(plan.stash)
    if sources:
        del stash[sources[0]]
    else:  # make a stashed source invalid instead: encode it lossily
        stash["conv1"] = "encode"
    with pytest.raises(PlanError, match="not live|lossily|names no codec"):
        lower(program, dataclasses.replace(plan, stash=stash, codecs={"conv1": "fp8"}))
    with pytest.raises(PlanError, match="network's input"):
        lower(program, dataclasses.replace(plan, stash={**plan.stash, "input": "recompute"}))
    with pytest.raises(PlanError, match="stash decision .drop.; use one of keep, offload, encode, recompute"):
        lower(program, dataclasses.replace(plan, stash={**plan.stash, "conv1": "drop"}))


def test_recompute_composes_with_offload_and_encodings():
    """One plan that recomputes, offloads (prefetched before the rebuild that reads it) and encodes
    losslessly: still bitwise equal to baseline, and the executor's peak is the plan's."""
    from vmem.policies.vdnn import prefetch_points
    from vmem.graph.backward import backward_uses, decisions
    from vmem.schedule.gradients import needs_grad

    make = bn_dropout_net
    net = make()
    program = net.build(8)
    echo = vmem.plan(net, 8, policy="echo").plan
    stash = dict(echo.stash)
    assert stash["conv1"] == "keep" and stash["input"] == "keep"
    stash["conv1"] = "offload"  # a rebuild source (batchnorm1 reads it)
    stash["input"] = "encode"  # read by conv1's backward
    decided = decisions(program, stash)
    walk = backward_uses(program, decided, needs_grad(program))
    reads = {u.op: [s for r in u.rebuilds for s in r.sources] + list(u.reads) for u in walk}
    offloaded = {program.tensor("conv1").id}
    prefetch = prefetch_points(program, offloaded, reads=reads)
    plan = dataclasses.replace(
        echo,
        policy="composed",
        stash=stash,
        codecs={"input": "zvc", "conv1": "zvc"},
        prefetch=prefetch,
        sync="layer",
        density=1.0,
    )  # the input has no zeros

    class Composed(vmem.policies.Policy):
        name = "composed"

        def decide(self, program, device, costs=None, oracle=None):
            return dataclasses.replace(plan, device=device.name, capacity=device.memory)

    x, y = batch(net.input_shape)
    weights = weights_under(make, ["baseline", Composed()], x, y, steps=3)
    assert all_equal(weights)
    schedule = lower(program, plan)
    kinds = {type(st).__name__ for st in schedule.steps}
    assert {"Recompute", "Offload", "Prefetch", "Encode", "Decode"} <= kinds


def test_echo_keeps_tanh_of_a_sum_of_two_linear_layers():
    """Echo's first example: recomputing tanh(x + y) would hold x and y (2N) to free N: nothing recomputed,
    where mirror holds more than layer-wise allocation."""
    g = vmem.Graph(input_shape=(64,), name="tanh_sum")
    a = g.add(nn.Linear(64, 256), g.input)
    b = g.add(nn.Linear(64, 256), g.input)
    s = g.add(nn.Add(), a, b)
    t = g.add(nn.Tanh(), s)
    g.add(nn.Linear(256, 10), t)
    echo = vmem.plan(g, 32, policy="echo")
    mirror = vmem.plan(g, 32, policy="mirror")
    layerwise = vmem.plan(g, 32, policy="layerwise")
    assert "recompute" not in echo.stash.values()
    assert echo.peak_bytes == layerwise.peak_bytes
    assert mirror.by_category["feature_maps"]["peak"] >= layerwise.by_category["feature_maps"]["peak"]
    assert echo.notes["add1"].startswith("kept")


@pytest.mark.parametrize("name", vmem.models.names())
def test_echo_never_peaks_above_layerwise_on_the_zoo(name):
    net = vmem.models.get(name, **({"seq_len": 25} if name == "nmt" else {}))  # full length: bench/recompute.py
    echo = vmem.plan(net, 8, "sim:titan-x", "echo", memory="1TiB", oversubscribe=True)
    layerwise = vmem.plan(net, 8, "sim:titan-x", "layerwise", memory="1TiB", oversubscribe=True)
    assert echo.peak_bytes <= layerwise.peak_bytes


def test_resnet152_echo_at_least_1_5x_below_layerwise():
    net = vmem.models.get("resnet152")
    echo = vmem.plan(net, 32, "sim:titan-x", "echo", memory="1TiB", oversubscribe=True)
    layerwise = vmem.plan(net, 32, "sim:titan-x", "layerwise", memory="1TiB", oversubscribe=True)
    assert layerwise.peak_bytes >= 1.5 * echo.peak_bytes, (layerwise.peak_bytes, echo.peak_bytes)


def _relu_logits_net():
    """A classifier whose logits come out of a ReLU, which reads its output in backward: the loss cannot
    write over them."""
    g = vmem.Graph(input_shape=(16,), name="relu_logits")
    g.add(nn.ReLU(), g.add(nn.Linear(32, 10), g.add(nn.ReLU(), g.add(nn.Linear(16, 32), g.input))))
    return g


def _dropout_logits_net():
    g = vmem.Graph(input_shape=(16,), name="dropout_logits")
    g.add(nn.Dropout(0.5), g.add(nn.Linear(32, 10), g.add(nn.ReLU(), g.add(nn.Linear(16, 32), g.input))))
    return g


@pytest.mark.parametrize(
    "make, inplace",
    [(_relu_logits_net, False), (_dropout_logits_net, True), (lambda: vmem.models.get("nmt_small"), True)],
    ids=["relu_logits", "dropout_logits", "nmt_small"],
)
def test_layerwise_loss_writes_probabilities_and_gradient_over_the_logits(make, inplace):
    """The loss holds one buffer instead of three where backward reads nothing sharing the logits' buffer
    (an in-place Dropout after the last Linear shares it and still may); the weights stay bitwise
    baseline's (which keeps three buffers)."""
    from vmem.schedule.lower import PROBS
    from vmem.schedule.steps import Alloc, Loss

    net = make()
    program = net.build(8)
    schedule = lower(program, vmem.plan(net, 8, policy="layerwise").plan)
    (loss,) = [st for st in schedule.steps if type(st) is Loss]
    assert loss.inplace is inplace
    assert any(type(st) is Alloc and st.buffer.key == PROBS for st in schedule.steps) is not inplace
    if inplace:  # d(logits) is the logits' buffer
        assert schedule.grad[program.output] == schedule.value[program.output]
    if net.name == "nmt_small":
        rng = np.random.default_rng(0)
        x = rng.integers(1, 50, (8, 16)).astype(np.float32)
        y = rng.integers(0, 50, (8, 8))
    else:
        x, y = batch(net.input_shape)
    assert all_equal(weights_under(make, ("baseline", "layerwise"), x, y, steps=3))


def test_mirror_is_mxnets_heuristic_and_takes_step_and_depth():
    """Every cheap op's output is recomputed but Concat's, every step-th kept; chains are unbounded unless
    ``depth`` says otherwise."""
    net = vmem.models.get("nmt_small")
    program = net.build(4)
    default = vmem.plan(net, 4, policy="mirror").plan
    concats = [op.name for op in program.ops if op.kind == "concat" and program.tensors[op.output].stashed]
    assert concats and all(default.stash[n] == "keep" for n in concats)
    every = vmem.plan(net, 4, policy="mirror:step=0").plan
    kept_by_step = {n for n, d in default.stash.items() if d == "keep"} - {
        n for n, d in every.stash.items() if d == "keep"
    }
    assert len(kept_by_step) >= 1  # nmt_small has over 100 candidates: the 100th is kept
    bounded = vmem.plan(net, 4, policy="mirror:depth=1").plan
    assert sum(d == "recompute" for d in bounded.stash.values()) < sum(d == "recompute" for d in default.stash.values())
    with pytest.raises(ValueError, match="mirror.*depth"):
        vmem.policies.get("mirror:depth=-1")


def test_echo_chooses_its_chain_depth_by_replay():
    net = vmem.models.get("nmt_small")
    result = vmem.plan(net, 16, policy="echo")
    assert "rebuild chains at most" in result.reason and "replayed peak by depth" in result.reason
    depth = int(result.reason.split("rebuild chains at most ")[1].split()[0])
    from vmem.policies import recompute

    assert depth in recompute.DEPTHS
    assert result.peak_bytes <= vmem.plan(net, 16, policy="layerwise").peak_bytes


@pytest.mark.parametrize("name, options", [("nmt", {"seq_len": 6}), ("resnet_cifar", {"depth": 8})])
def test_echos_trials_resume_their_walk_and_hold_what_a_whole_walk_holds(name, options, monkeypatch):
    """Echo weighs hundreds of groups to keep; each trial walks the buffers again from a copy of the state
    taken before the group's first one (before it nothing differs): the bytes held are a whole walk's."""
    from vmem.policies.recompute import _Graph

    monkeypatch.setattr(_Graph, "RESUME_EVERY", 4)  # resume from many places on these small graphs

    g = _Graph(vmem.models.get(name, **options).build(4))
    rebuildable = lambda s: s in g.cheap  # noqa: E731
    recompute = {b for b in g.stashed if b in g.cheap}
    rng = np.random.default_rng(0)
    for depth in (1, 2, None):
        cache: dict = {}
        trials = g.trials(recompute, rebuildable, depth, cache)
        assert trials.held == g.close_held(recompute, rebuildable, depth, cache)[1]
        members = sorted(recompute)
        for _ in range(40):
            group = set(rng.choice(members, size=min(len(members), int(rng.integers(1, 4))), replace=False).tolist())
            group &= trials.recompute
            if not group:
                continue
            assert trials.without(group) == g.close_held(trials.recompute - group, rebuildable, depth, cache)[1]
            if rng.random() < 0.2:
                trials.remove(group)
                assert trials.held == g.close_held(trials.recompute, rebuildable, depth, cache)[1]
