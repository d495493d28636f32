"""Replay on a hand-made schedule: the pool's peak, the two streams' virtual clocks, stalls and the
time-weighted average, against figures worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

import vmem
from vmem.errors import OutOfDeviceMemory
from vmem.schedule import Buffer, Key, Kind, Schedule
from vmem.schedule.steps import Alloc, Forward, Free, Offload, Prefetch, Release, WaitPrefetch
from vmem.schedule.replay import durations, replay

KiB = 1024
A, B = Key(Kind.VALUE, "a"), Key(Kind.VALUE, "b")


class Costs:
    """Every forward takes 1 s; copies move 1000 bytes a second."""

    def op_seconds(self, op, pass_, algo):
        return 1.0

    def copy_seconds(self, nbytes, direction):
        return nbytes / 1000

    def update_seconds(self, param_bytes):
        return 0.0

    def misc_seconds(self, kind, nbytes):
        return 0.0


def schedule(sync: str) -> Schedule:
    program = vmem.models.get("digits_cnn").build(1)
    a, b = Buffer(A, KiB, "feature_maps"), Buffer(B, 2 * KiB, "feature_maps")
    steps = [
        Alloc(a),
        Forward(0),  # compute writes a: 0 -> 1
        Offload(A, KiB, 2000, (KiB // 4,)),  # memory copies a: 1 -> 3
        Alloc(b),
        Forward(0),  # compute reads a: 1 -> 2
        Release(A, sync),  # layer: compute waits until 3
        Alloc(a),
        Prefetch(A, 2000, (KiB // 4,)),  # memory from compute's clock, 2 s
        Forward(0),  # compute + 1
        WaitPrefetch(A),
        Free(A),
        Free(B),
    ]
    return Schedule(program=program, persistent=[], steps=steps, value={}, alignment=256)


def test_sync_layer_waits_for_each_copy_at_the_end_of_its_last_reader():
    figures = replay(schedule("layer"), vmem.device("sim:titan-x", memory="1MiB"), Costs())
    # compute: fwd 0-1; the copy (1-3) overlaps the reader's fwd 1-2; the release waits until 3 (stall 1);
    # prefetch 3-5; fwd 3-4; wait until 5 (stall 1)
    assert figures.step_seconds == pytest.approx(5.0)
    assert figures.stall_seconds == pytest.approx(2.0)
    assert figures.peak_bytes == 3 * KiB  # b and the prefetched a
    assert figures.offloaded_bytes == 2000


def test_sync_event_never_waits_for_an_offload():
    figures = replay(schedule("event"), vmem.device("sim:titan-x", memory="1MiB"), Costs())
    # compute: fwd 0-1, fwd 1-2, no wait at the release; the prefetch waits for the memory stream's offload
    # (until 3), then 3-5; fwd 2-3; wait until 5 (stall 2)
    assert figures.step_seconds == pytest.approx(5.0)
    assert figures.stall_seconds == pytest.approx(2.0)


def test_reusing_memory_whose_copy_is_still_running_stalls_compute_until_the_copy_ends():
    """With sync=event nothing waits at the release; but when the next block needs that memory, the pool
    waits on the host for the copy's event, and compute's later work cannot start before it."""
    program = vmem.models.get("digits_cnn").build(1)
    c = Key(Kind.VALUE, "c")
    steps = [
        Alloc(Buffer(A, KiB, "feature_maps")),
        Forward(0),  # compute 0 -> 1
        Offload(A, KiB, 2000, (KiB // 4,)),  # memory copies a: 1 -> 3
        Release(A, "event"),  # freed on the memory stream, after the copy
        Alloc(Buffer(c, KiB, "feature_maps")),
        Forward(0),  # only a's memory is left: wait until 3, 3 -> 4
        Free(c),
    ]
    sched = Schedule(program=program, persistent=[], steps=steps, value={}, alignment=256)
    figures = replay(sched, vmem.device("sim:titan-x", memory="1KiB"), Costs())
    assert figures.step_seconds == pytest.approx(4.0)
    assert figures.stall_seconds == pytest.approx(2.0)
    roomy = replay(sched, vmem.device("sim:titan-x", memory="2KiB"), Costs())  # c fits beside a: no wait
    assert roomy.step_seconds == pytest.approx(3.0) and roomy.stall_seconds == pytest.approx(0.0)


def test_the_average_is_weighted_by_time_and_the_peak_is_the_pools():
    figures = replay(schedule("layer"), vmem.device("sim:titan-x", memory="1MiB"), Costs())
    # in use while compute runs or waits: 1 KiB for 1 s, then 3 KiB (a and b) for the reader's 1 s and the
    # 1 s wait at the release, 3 KiB (b and the prefetched a) for 1 s and the 1 s prefetch wait
    assert figures.average_bytes == pytest.approx((1 * KiB + 3 * KiB * 4) / 5)
    assert figures.by_category["feature_maps"]["peak"] == 3 * KiB


def test_the_figures_say_where_the_peak_was_reached():
    figures = replay(schedule("layer"), vmem.device("sim:titan-x", memory="1MiB"), Costs())
    # in use at each forward: 1 KiB, 3 KiB (a and b), then 3 KiB again (b and the prefetched a): the first
    name = vmem.models.get("digits_cnn").build(1).ops[0].name
    assert figures.peak_at == f"forward {name}"
    assert figures.layer_peaks == {name: 3 * KiB}


def test_without_costs_compute_is_weighted_by_flops_and_nothing_is_timed():
    figures = replay(schedule("layer"), vmem.device("sim:titan-x", memory="1MiB"))
    assert figures.step_seconds is None and figures.stall_seconds is None
    assert figures.peak_bytes == 3 * KiB


def test_a_schedule_beyond_the_capacity_raises():
    with pytest.raises(OutOfDeviceMemory):
        replay(schedule("layer"), vmem.device("sim:titan-x", memory="2KiB"))


def test_durations_are_per_step_and_zero_for_memory_steps():
    sched = schedule("layer")
    assert durations(sched, Costs()) == [0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]


@pytest.mark.parametrize(
    "policy", ["baseline", "layerwise", "vdnn-all:sync=event", "gist", "echo", "vdnn-conv:codec=zvc"]
)
def test_the_live_bytes_the_placement_records_are_the_replays_peak(policy):
    """A schedule's ``live_bytes`` (from its blocks' lifetimes) is the pool's peak in the replay: a plan
    whose live bytes exceed a device's memory fits it under no placement, with no replay needed."""
    from vmem.planning import UNBOUNDED, replay_if_fits
    from vmem.schedule.lower import lower

    device = vmem.device("sim:v100-16gb").spec
    program = vmem.models.get("mini_googlenet", image_size=16).build(8)
    schedule = lower(program, vmem.policies.get(policy).decide(program, device))
    figures = replay(schedule, vmem.device("sim:v100-16gb", memory=UNBOUNDED))
    assert schedule.live_bytes == figures.peak_bytes
    assert replay_if_fits(schedule, dataclasses.replace(device, memory=figures.peak_bytes - 256)) is None
    assert (
        replay_if_fits(schedule, dataclasses.replace(device, memory=figures.peak_bytes * 2)).peak_bytes
        == figures.peak_bytes
    )


class HostCosts(Costs):
    """As Costs, and the host enqueues each step in 0.5 s; each stream item costs 0.25 s besides its work."""

    def host_overheads(self):
        return 0.5, 0.25


def test_the_host_enqueues_the_step_before_the_streams_start_and_each_item_costs_its_stream():
    figures = replay(schedule("layer"), vmem.device("sim:titan-x", memory="1MiB"), HostCosts())
    # both streams start at 6 (12 steps enqueued); then as without the host, each of compute's five items
    # (three forwards, the release's wait, the prefetch's wait) and memory's two copies 0.25 s longer:
    # fwd 6-7.25; copy 7.25-9.5; fwd 7.25-8.5; release waits until 9.5 (stall 1), 9.75; prefetch 9.75-12;
    # fwd 9.75-11; wait until 12 (stall 1), 12.25
    assert figures.step_seconds == pytest.approx(12.25)
    assert figures.stall_seconds == pytest.approx(2.0)
    assert figures.peak_bytes == 3 * KiB


class SharedCores(HostCosts):
    """As HostCosts, and each copy the memory stream runs takes 0.5 s from the compute stream."""

    def host_overheads(self):
        return 0.5, 0.25, 0.5


def test_each_copy_takes_its_share_from_the_compute_stream_where_the_streams_share_the_cores():
    figures = replay(schedule("layer"), vmem.device("sim:titan-x", memory="1MiB"), SharedCores())
    # as above, with compute 0.5 s later after the offload (fwd 7.75-9) and after the prefetch: the release
    # waits for the copy until 9.5 (stall 0.5), 9.75; prefetch 9.75-12, compute 10.25; fwd 10.25-11.5; wait
    # until 12 (stall 0.5), 12.25
    assert figures.step_seconds == pytest.approx(12.25)
    assert figures.stall_seconds == pytest.approx(1.0)
