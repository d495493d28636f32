"""The loss scaler reproduces PyTorch's GradScaler: the same scale after every step of a scripted pattern
of overflows (recorded from torch 2.13's ``torch.amp.GradScaler("cpu")``; compared live where torch is
installed)."""

from __future__ import annotations

import numpy as np
import pytest

from vmem.optim import GradScaler

#: steps whose gradients overflow (1) or not (0)
PATTERN = [0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
CASES = {
    "defaults, growth every 3": (
        {"growth_interval": 3},
        [65536.0, 65536.0, 32768.0, 32768.0, 32768.0, 65536.0, 65536.0, 32768.0, 16384.0, 16384.0]
        + [16384.0, 32768.0, 32768.0, 32768.0, 65536.0, 65536.0, 32768.0, 32768.0, 32768.0, 65536.0],
    ),
    "odd factors in float32": (
        {"init_scale": 3.0, "growth_factor": 1.7, "backoff_factor": 0.3, "growth_interval": 2},
        [3.0, 5.099999904632568, 1.5299999713897705, 1.5299999713897705, 2.6009998321533203]
        + [2.6009998321533203, 4.421699523925781, 1.3265098333358765, 0.39795294404029846, 0.39795294404029846]
        + [0.6765199899673462, 0.6765199899673462, 1.1500840187072754, 1.1500840187072754, 1.955142855644226]
        + [1.955142855644226, 0.5865428447723389, 0.5865428447723389, 0.9971228241920471, 0.9971228241920471],
    ),
}


def _ours(kwargs):
    scaler = GradScaler(**kwargs)
    seq = []
    for bad in PATTERN:
        scaler.update(bool(bad))
        seq.append(scaler.scale)
    return scaler, seq


@pytest.mark.parametrize("case", list(CASES))
def test_the_scale_sequence_is_pytorchs_exactly(case):
    kwargs, recorded = CASES[case]
    scaler, seq = _ours(kwargs)
    assert seq == recorded
    assert scaler.skipped == sum(PATTERN)


@pytest.mark.parametrize("case", list(CASES))
def test_the_scale_sequence_against_torch_live(case):
    torch = pytest.importorskip("torch")
    kwargs, _ = CASES[case]
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    theirs = torch.amp.GradScaler("cpu", **kwargs)
    seq = []
    for bad in PATTERN:
        opt.zero_grad()
        theirs.scale((p * (float("inf") if bad else 1.0)).sum()).backward()
        theirs.step(opt)
        theirs.update()
        seq.append(theirs.get_scale())
    assert _ours(kwargs)[1] == seq


def test_the_scale_does_not_grow_past_float32_and_survives_a_checkpoint():
    scaler = GradScaler(init_scale=2.0**127, growth_interval=1)
    scaler.update(False)
    assert scaler.scale == 2.0**127  # 2**128 is not a finite float32: kept
    scaler.update(True)
    other = GradScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.scale == 2.0**126 and other.skipped == 1 and other.growth_tracker == 0
    assert scaler.inverse() == float(np.float32(2.0**-126))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"init_scale": 0}, "init_scale"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.5}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GradScaler(**kwargs)
