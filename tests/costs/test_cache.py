"""The profile cache is untrusted input: a kept file is used only where it holds the schema (anything else is
measured afresh with one warning), its text never drives the terminal, nothing is written through a planted
link, and the first complete profile kept under a key is the one every run uses."""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vmem
from vmem.costs import cache
from vmem.costs.measured import Profiled


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VMEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VMEM_PROFILE_CACHE", raising=False)
    return tmp_path / "cache" / "profiles"


NET = vmem.models.get("digits_cnn")
PROGRAM = NET.build(8)


def _measured() -> dict:
    """A real profile of digits_cnn at batch 8 on the CPU device, as kept on disk (made once)."""
    if not hasattr(_measured, "kept"):
        with vmem.device("cpu", memory="16MiB") as dev:
            _measured.kept = cache.profile(dev.catalog(PROGRAM), device=dev, cache=False)[0].to_dict()
    return json.loads(json.dumps(_measured.kept))


def _plant(folder, text: str, digest: str = "0" * 32):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{digest}.json").write_text(text)
    return digest


def _figures_finite(costs: Profiled) -> None:
    result = vmem.plan(NET, 8, device="cpu", policy="baseline:algos=performance", costs=costs)
    assert math.isfinite(result.step_seconds) and result.step_seconds >= 0
    assert math.isfinite(result.peak_bytes)


def test_a_good_profile_round_trips(folder):
    digest = _plant(folder, json.dumps(_measured()))
    kept = cache.load(digest)
    assert kept is not None and kept.to_dict() == _measured()
    _figures_finite(kept)


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("d2h_gbps", 0, "d2h_gbps: 0.0, not a positive"),
        ("h2d_gbps", -3.0, "h2d_gbps: -3.0"),
        ("update", "fast", "update: str, not a number"),
        ("copies", [[-1, 0.1]], "copies\\[0\\]: -1 bytes"),
        ("notes", "no", "notes: not a list"),
    ],
)
def test_a_field_outside_the_schema_is_measured_afresh_with_one_warning(folder, field, value, why):
    data = _measured()
    data[field] = value
    digest = _plant(folder, json.dumps(data))
    with pytest.warns(cache.CacheWarning, match=f"is not used \\({why}"):
        assert cache.load(digest) is None


@pytest.mark.parametrize("seconds", ["NaN", "-1.0", "Infinity", "1e300"])
def test_times_that_are_not_measurements_are_refused(folder, seconds):
    """NaN and negative times changed the plan; JSON's Infinity and NaN literals are not figures."""
    data = _measured()
    data["times"][0][3] = "HERE"
    text = json.dumps(data).replace('"HERE"', seconds)
    digest = _plant(folder, text)
    with pytest.warns(cache.CacheWarning):
        assert cache.load(digest) is None


def test_notes_reach_the_terminal_escaped(folder):
    data = _measured()
    data["notes"] = ["\x1b[2J\x1b[31mred\x07 and a new\nline"]
    kept = cache.load(_plant(folder, json.dumps(data)))
    assert kept is not None and kept.notes == ["\\x1b[2J\\x1b[31mred\\x07 and a new\\nline"]
    assert all(c.isprintable() for c in kept.notes[0])


def test_a_fifo_or_a_link_is_not_read_and_nothing_is_written_through_a_link(folder, tmp_path):
    folder.mkdir(parents=True)
    digest = "1" * 32
    os.mkfifo(folder / f"{digest}.json")
    t0 = time.monotonic()
    with pytest.warns(cache.CacheWarning, match="not a regular file"):
        assert cache.load(digest) is None
    assert time.monotonic() - t0 < 1  # never blocked on the FIFO
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    digest = "2" * 32
    os.symlink(victim, folder / f"{digest}.json")
    with pytest.warns(cache.CacheWarning, match="symbolic link"):
        assert cache.load(digest) is None
    made = cache.parse(_measured())
    assert cache.store(digest, made) is made
    assert victim.read_text() == "mine"  # not written through the link
    path = folder / f"{digest}.json"
    assert not path.is_symlink() and path.is_file() and cache.load(digest) is not None  # the link replaced


def test_folders_are_private_and_files_owner_only(folder):
    cache.store("3" * 32, cache.parse(_measured()))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / f"{'3' * 32}.json").stat().st_mode) == 0o600
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left


def test_the_first_complete_writer_wins(folder, monkeypatch):
    """Two processes (here threads) measuring one key at once: both use the profile kept first."""
    import vmem.costs.measured as measured

    barrier = threading.Barrier(2)
    made = {}

    def measure(program, **kwargs):
        name = threading.current_thread().name
        profile = cache.parse(_measured())
        profile.update = {"first": 0.001, "second": 0.002}[name]
        barrier.wait()  # both have measured before either keeps
        if name == "second":
            time.sleep(0.2)  # the first keeps its profile first
        return profile

    monkeypatch.setattr(measured, "profile", measure)
    with vmem.device("cpu", memory="16MiB") as dev:
        program = dev.catalog(PROGRAM)

        def run():
            made[threading.current_thread().name] = cache.profile(program, device=dev)

        threads = [threading.Thread(target=run, name=n) for n in ("first", "second")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert made["first"][0].update == made["second"][0].update == 0.001
        assert made["first"][1] is False and made["second"][1] is True  # the second used the kept one
        again, kept = cache.profile(program, device=dev)
        assert kept and again.update == 0.001


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def _files(draw):
    """Whole JSON documents, and real profiles with one field, one time row or one figure replaced."""
    kind = draw(st.sampled_from(["any", "field", "row", "time", "text"]))
    if kind == "any":
        return json.dumps(draw(_json))
    data = _measured()
    if kind == "field":
        data[draw(st.sampled_from(sorted(data)))] = draw(_json)
    elif kind == "row":
        data["times"][draw(st.integers(0, len(data["times"]) - 1))] = draw(_json)
    elif kind == "time":
        row = draw(st.integers(0, len(data["times"]) - 1))
        data["times"][row][3] = draw(st.none() | st.floats() | st.integers(-(2**70), 2**70))
    else:
        text = json.dumps(data)
        cut = draw(st.integers(0, len(text)))
        return text[:cut] + draw(st.text(max_size=5))
    return json.dumps(data)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_files())
def test_fuzzed_cache_files_never_crash_and_never_plan_a_non_finite_figure(folder, text):
    digest = _plant(folder, text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cache.CacheWarning)
        kept = cache.load(digest)
    if kept is not None:
        _figures_finite(kept)


@pytest.mark.parametrize("planted", ["fifo", "folder", "cache folder a file"])
def test_a_profile_that_could_not_be_kept_is_said_so(folder, planted, monkeypatch, tmp_path):
    """ "kept in ... for the next run" only where it was: a FIFO or a folder at the profile's name, or a file
    where the cache's folder should be, leaves it unkept, and the line the command prints says so."""
    from vmem.cli.progress import profile_line

    digest = "3" * 32
    if planted == "cache folder a file":
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.write_text("not a folder")
    else:
        folder.mkdir(parents=True)
        path = folder / f"{digest}.json"
        os.mkfifo(path) if planted == "fifo" else path.mkdir()
    made = cache.parse(_measured())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cache.CacheWarning)
        assert cache.store(digest, made) is made
    assert cache.not_kept() is not None
    line = profile_line(False, 1.5)
    assert "not kept" in line and "the next run measures it again" in line and "for the next run" not in line
    monkeypatch.setenv("VMEM_CACHE_DIR", str(tmp_path / "elsewhere"))
    cache.store("4" * 32, made)
    assert cache.not_kept() is None and "for the next run" in profile_line(False, 1.5)
