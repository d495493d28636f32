"""Timing helpers: the shortest of a few runs or the median of the undisturbed ones, and on a busy machine
enough runs to see undisturbed ones."""

from __future__ import annotations

import pytest

from vmem import benchmarks


class _Work:
    """A call that takes the given (wall, CPU) seconds in turn, on clocks of its own; a bare number is
    a call that ran all the time (CPU time = wall time)."""

    def __init__(self, monkeypatch, runs):
        self.wall = self.cpu = 0.0
        self.calls, self.runs = 0, [r if isinstance(r, tuple) else (r, r) for r in runs]
        monkeypatch.setattr(benchmarks.time, "perf_counter", lambda: self.wall)
        monkeypatch.setattr(benchmarks.time, "process_time", lambda: self.cpu)

    def __call__(self) -> None:
        wall, cpu = self.runs[self.calls]
        self.wall += wall
        self.cpu += cpu
        self.calls += 1


def test_best_seconds_is_the_shortest_of_its_rounds(monkeypatch):
    work = _Work(monkeypatch, [5.0, 3.0, 4.0, 1.0])
    assert benchmarks.best_seconds(work, 3) == 3.0 and work.calls == 3
    work = _Work(monkeypatch, [9.0, 2.0, 3.0])
    assert benchmarks.best_seconds(work, 2, warmup=True) == 2.0 and work.calls == 3
    # without undisturbed=True, preempted runs count as they are
    work = _Work(monkeypatch, [(5.0, 1.0), (5.1, 1.0), (5.2, 1.0), 1.0])
    assert benchmarks.best_seconds(work, 3) == 5.0 and work.calls == 3


def test_undisturbed_goes_on_until_the_shortest_run_was_not_preempted(monkeypatch):
    # each of the first three runs lost a time slice of 4 to another process (they agree with each
    # other: agreement is no sign of an undisturbed run)
    work = _Work(monkeypatch, [(5.0, 1.0), (5.1, 1.05), (5.05, 1.0), (4.9, 0.95), 1.02, 9.0])
    assert benchmarks.best_seconds(work, 3, undisturbed=True) == pytest.approx(1.02) and work.calls == 5
    # a quiet machine: done within its rounds
    work = _Work(monkeypatch, [1.0, 1.02, 1.01, 9.0])
    assert benchmarks.best_seconds(work, 3, undisturbed=True) == 1.0 and work.calls == 3
    # work on two threads at once (CPU time twice the wall time) is undisturbed too
    work = _Work(monkeypatch, [(1.0, 2.0), (1.1, 2.0), (1.05, 2.1), 9.0])
    assert benchmarks.best_seconds(work, 3, undisturbed=True) == 1.0 and work.calls == 3


def test_undisturbed_stops_at_most_runs(monkeypatch):
    runs = [(10.0 - i, 1.0) for i in range(10)]  # every run preempted
    work = _Work(monkeypatch, runs)
    assert benchmarks.best_seconds(work, 2, undisturbed=True) == pytest.approx(3.0) and work.calls == 8
    work = _Work(monkeypatch, runs)
    assert benchmarks.best_seconds(work, 2, undisturbed=True, most=3) == 8.0 and work.calls == 3


def test_typical_seconds_is_the_median_of_undisturbed_runs(monkeypatch):
    # a preempted run (CPU time well under its wall time) is not counted, however short or long
    work = _Work(monkeypatch, [1.2, (9.0, 1.0), 1.0, 1.5, 7.0])
    assert benchmarks.typical_seconds(work, 3) == pytest.approx(1.2) and work.calls == 4
    # a quiet machine: its rounds, their median (not their least)
    work = _Work(monkeypatch, [1.3, 1.0, 1.1, 9.0])
    assert benchmarks.typical_seconds(work, 3) == pytest.approx(1.1) and work.calls == 3
    # two threads busy (CPU time twice the wall time) are undisturbed too
    work = _Work(monkeypatch, [(1.0, 2.0), (1.2, 2.4), (1.1, 2.2)])
    assert benchmarks.typical_seconds(work, 3) == pytest.approx(1.1) and work.calls == 3


def test_typical_seconds_takes_the_shortest_runs_when_too_few_ran_undisturbed(monkeypatch):
    runs = [(10.0 - i, 1.0) for i in range(10)]  # every run preempted
    work = _Work(monkeypatch, runs)
    assert benchmarks.typical_seconds(work, 2) == pytest.approx(3.5) and work.calls == 8  # of 3.0 and 4.0
    work = _Work(monkeypatch, runs)
    assert benchmarks.typical_seconds(work, 2, most=3) == pytest.approx(8.5) and work.calls == 3
