"""``vmem.curve`` and ``vmem plan --curve``: auto's plans from the least memory it trains in to keeping everything,
a lower envelope (memory rising, predicted time falling), the named policies each at its least memory beside."""

from __future__ import annotations

import json

import pytest

import vmem
from vmem.planning.curve import CurvePoint, envelope


@pytest.fixture(scope="module")
def vgg_curve():
    return vmem.curve(vmem.models.get("vgg_cifar"), 64, "sim:h100-sxm")


def test_the_curve_runs_from_autos_floor_to_keeping_everything_and_is_monotone(vgg_curve):
    c = vgg_curve
    assert c.planned >= 20 and len(c.points) >= 8
    memory = [p.memory for p in c.points]
    seconds = [p.step_seconds for p in c.points]
    assert memory == sorted(set(memory)) and seconds == sorted(seconds, reverse=True)  # strictly so
    assert len(set(seconds)) == len(seconds)
    assert all(p.memory <= p.budget for p in c.points)  # each plan fits the budget it was made for
    assert c.points[0].memory <= c.floor * 1.01 and c.points[-1].memory == c.keep_all
    keep_all = vmem.plan(vmem.models.get("vgg_cifar"), 64, "sim:h100-sxm", "auto")
    assert c.keep_all == keep_all.peak_bytes and c.points[-1].step_seconds == pytest.approx(keep_all.step_seconds)
    assert c.points[0].techniques["stash"] != {"keep": c.points[0].techniques["stash"].get("keep")}  # it does something


def test_auto_beats_each_named_policy_at_that_policys_least_memory(vgg_curve):
    """Where a named policy trains in the least memory it can, auto's curve is at least as fast there."""
    named = {p.policy: p for p in vgg_curve.named}
    assert {"baseline", "vdnn-all", "vdnn-conv", "echo"} <= set(named)
    for p in named.values():
        under = [q for q in vgg_curve.points if q.memory <= p.memory]
        assert under and min(q.step_seconds for q in under) <= p.step_seconds * 1.0001, p.policy


def test_the_curve_is_plain_data_a_table_and_a_plot(vgg_curve, tmp_path):
    data = json.loads(vgg_curve.json())
    assert data["network"] == "vgg_cifar" and len(data["points"]) == len(vgg_curve.points)
    assert {"budget", "memory", "step_seconds", "policy", "techniques", "packing"} <= set(data["points"][0])
    for p in (*vgg_curve.points, *vgg_curve.named):  # each plan's packing and its convolutions' algorithms
        assert p.packing is not None and 1.0 <= p.packing < 1.02
        assert set(p.techniques["algos"]) == {"forward", "backward_data", "backward_filter"}
        assert all(sum(by.values()) == 8 for by in p.techniques["algos"].values())  # vgg_cifar's 8 convolutions
    text = vgg_curve.table()
    assert "auto trains in" in text and "keeps everything" in text and "vdnn-all" in text and "packing" in text
    pytest.importorskip("matplotlib")
    vgg_curve.plot(str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_envelope_drops_what_is_slower_for_more_memory():
    def p(memory, seconds):
        return CurvePoint(memory, memory, seconds, "auto", {})

    got = envelope([p(10, 5.0), p(20, 6.0), p(30, 4.0), p(30, 3.5), p(40, 3.5), p(50, 1.0)])
    assert [(q.memory, q.step_seconds) for q in got] == [(10, 5.0), (30, 3.5), (50, 1.0)]


def test_vmem_plan_curve_prints_the_curve_and_refuses_what_it_cannot_do(capsys):
    from vmem.cli import main

    assert main(["plan", "--model", "digits_cnn", "--batch", "16", "--device", "sim:titan-x", "--curve", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["points"] and data["floor"] <= data["keep_all"]
    assert (
        main(
            ["plan", "--model", "digits_cnn", "--batch", "16", "--device", "sim:titan-x", "--curve", "--memory", "1MiB"]
        )
        != 0
    )
    assert "drop --memory" in capsys.readouterr().err
    assert main(["plan", "--model", "digits_cnn", "--batch", "16", "--device", "cpu", "--curve"]) != 0
    assert "--profile" in capsys.readouterr().err
    argv = ["plan", "--model", "digits_cnn", "--batch", "16", "--device", "sim:titan-x"]
    assert main([*argv, "--curve", "--json", "--jobs", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == data  # the same curve in one process as in one per core
    assert main([*argv, "--jobs", "2"]) != 0
    assert "--jobs plans a curve's budgets side by side: add --curve" in capsys.readouterr().err


def test_a_plan_reports_what_placement_costs():
    """The packed peak over the most bytes live at once, in the figures, their JSON and the table."""
    result = vmem.plan(vmem.models.get("vgg_cifar"), 64, "sim:h100-sxm", "vdnn-all")
    assert result.live_bytes and result.live_bytes <= result.peak_bytes
    assert result.packing == pytest.approx(result.peak_bytes / result.live_bytes) and result.packing < 1.02
    assert result.to_dict()["packing"] == pytest.approx(result.packing)
    assert "packing 1.0" in result.table().splitlines()[0]


def test_a_measured_curve_runs_each_points_plan_at_its_planned_peak(capsys):
    """``--measure`` on the CPU device: each point's plan (auto's and the named policies') trained, its
    measured peak exactly the planned, its median step measured, the plan the curve shows (no re-plan)."""
    from vmem.cli import main
    from vmem.training.curve import measured_curve

    net = vmem.models.get("digits_cnn")
    made = measured_curve(net, 8, "cpu", points=3, most=3, steps=1)
    every = (*made.points, *made.named)
    assert len(made.points) >= 2 and made.named
    for p in every:
        assert p.measured_peak == p.memory and p.measured_seconds > 0 and p.replanned is None, p
    assert "/pred" in made.table()
    argv = ["plan", "--model", "digits_cnn", "--batch", "8", "--device", "cpu"]
    assert main([*argv, "--measure", "2"]) != 0
    assert "--measure measures the points of a curve: add --curve" in capsys.readouterr().err
    assert (
        main(["plan", "--model", "digits_cnn", "--batch", "8", "--device", "sim:titan-x", "--curve", "--measure"]) != 0
    )
    assert "use a real device" in capsys.readouterr().err


def test_a_curve_planned_in_two_processes_is_the_curve_planned_in_one():
    net = vmem.models.get("vgg_cifar")
    one = vmem.curve(net, 32, "sim:h100-sxm", points=6, most=8)
    seen: list[tuple[int, int]] = []
    two = vmem.curve(net, 32, "sim:h100-sxm", points=6, most=8, workers=2, progress=lambda d, t: seen.append((d, t)))
    assert two == one
    assert [d for d, _ in seen] == list(range(1, len(seen) + 1)) and all(d <= t for d, t in seen)
    with pytest.raises(ValueError, match="workers=0"):
        vmem.curve(net, 32, "sim:h100-sxm", workers=0)


def test_a_curve_that_cannot_be_sent_to_another_process_is_planned_in_this_one():
    """A target whose catalog is a local function (as a Device's bound one holds the device) cannot be pickled:
    the budgets are planned here, the same curve."""
    from vmem.planning.target import Target

    net = vmem.models.get("digits_cnn")
    card = Target.of("sim:titan-x")
    local = Target(card.spec, card.alignment, lambda program: card.view(program))
    assert vmem.curve(net, 8, local, points=3, most=3, workers=2) == vmem.curve(net, 8, card, points=3, most=3)


def test_a_curve_says_the_largest_batch_that_trains_whole_at_the_devices_own_capacity():
    from vmem.planning.budget import largest_batch
    from vmem.policies.auto import Auto

    net = vmem.models.get("vgg_cifar")
    c = vmem.curve(net, 32, "sim:titan-x", points=3, most=3)
    assert c.capacity == vmem.device("sim:titan-x").spec.memory and c.splittable
    assert c.largest_batch == largest_batch(net, "sim:titan-x", policy=Auto.floor) > 32
    assert f"batches up to {c.largest_batch} train whole (larger ones as micro-batches)" in c.table()
    assert json.loads(c.json())["largest_batch"] == c.largest_batch


def test_a_curve_on_a_device_of_this_process_is_planned_here(monkeypatch):
    """A Device's own catalog (its pool, its streams) is not sent to other processes: asked for two, the
    budgets are planned in this one, without trying to pickle the device."""
    import pickle

    from vmem.planning import profiles

    net = vmem.models.get("digits_cnn")
    with vmem.device("cpu", memory="64MiB") as dev:
        costs, _ = profiles.measure(net, 8, dev)
        tried = []
        dumps = pickle.dumps
        monkeypatch.setattr(pickle, "dumps", lambda obj, *a, **k: tried.append(obj) or dumps(obj, *a, **k))
        two = vmem.curve(net, 8, dev, costs=costs, points=3, most=3, workers=2)
        assert not tried
        assert two == vmem.curve(net, 8, dev, costs=costs, points=3, most=3)


def test_a_budget_that_plans_no_point_is_not_planned_again(monkeypatch):
    """Where auto plans nothing at a budget between two that differ in time, the refinement does not ask for
    that budget again (it once would have for ever) and ends."""
    import sys

    curve_module = sys.modules["vmem.planning.curve"]
    point = curve_module._Planner.point
    asked: list[int] = []

    def failing(self, task):
        what, _, budget = task
        if what != "at":
            return point(self, task)
        asked.append(budget)
        return point(self, task) if len(asked) <= 4 else None  # the first four budgets plan; later ones none

    monkeypatch.setattr(curve_module._Planner, "point", failing)
    c = vmem.curve(vmem.models.get("vgg_cifar"), 32, "sim:h100-sxm", points=4, most=12)
    assert len(asked) > 4 and len(asked) == len(set(asked)) and c.planned == 4
