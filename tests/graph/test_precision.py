"""A dtype per tensor: a layer may store its output in another dtype than the network's (here fp16), and
the Program, the lowering, the packing, the replay and the executor all count and view it in that dtype."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.graph.program import Precision
from vmem.nn.base import Layer
from vmem.schedule.steps import Alloc


class _Half(Layer):
    """The identity, its output stored in float16 (its gradient too, as every tensor's)."""

    def output_dtype(self, in_dtypes, dtype):
        return "float16"

    def forward(self, ctx, xs, y):
        y[...] = xs[0]

    def backward(self, ctx, dy, xs, y, dxs):
        if dxs[0] is not None:
            dxs[0][...] = dy


def _net(half: bool = True):
    layers = [nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()] + ([_Half()] if half else [])
    return vmem.Sequential(*layers, nn.Flatten(), nn.Linear(4 * 8 * 8, 10), input_shape=(1, 8, 8))


def test_a_layer_stores_its_output_in_its_own_dtype_and_a_reshape_keeps_it():
    program = _net().build(8)
    dtypes = {t.name: t.dtype for t in program.tensors}
    half = next(t for t in program.tensors if t.dtype == "float16")
    flat = program.tensors[program.ops[half.producer + 1].output]
    assert half.nbytes == 2 * 8 * 4 * 8 * 8 and flat.dtype == "float16" and flat.buffer == half.buffer
    assert dtypes["input"] == "float32" and program.tensors[program.output].dtype == "float32"
    assert program.precision == Precision.uniform("float32")


@pytest.mark.parametrize("policy", ["baseline", "layerwise", "vdnn-all"])
def test_the_lowering_allocates_the_fp16_buffer_and_its_gradient_at_fp16_size(policy):
    from vmem.planning import plan_program
    from vmem.device.specs import get as get_spec

    program = _net().build(8)
    half = next(t for t in program.tensors if t.dtype == "float16")
    _, schedule = plan_program(program, get_spec("titan-x"), policy)
    sizes = {st.buffer.key: st.buffer.nbytes for st in schedule.steps if type(st) is Alloc}
    assert sizes[schedule.value[half.id]] == half.nbytes == 2 * 8 * 256
    if half.id in schedule.grad:
        assert sizes[schedule.grad[half.id]] == half.nbytes


def step_half_and_full(policy: str, device) -> None:
    """One step of the network with its fp16-stored tensor and of the same network all in fp32, each on a
    device ``device()`` makes: both at exactly their planned peak, the weights within fp16 rounding."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    weights = {}
    for half in (True, False):
        net = _net(half)
        with device() as dev, vmem.Trainer(net, device=dev, policy=policy, seed=0) as t:
            report = t.step(x, y)
            assert report.peak_bytes == t.plans[8].peak_bytes  # replayed and run: the same bytes
            assert np.isfinite(report.loss)
        weights[half] = {
            k.split(".", 1)[1]: v.copy() for k, v in net.params.items() if k.startswith(("conv", "linear"))
        }
    for k, w in weights[False].items():
        np.testing.assert_allclose(weights[True][k], w, rtol=1e-2, atol=1e-4)  # fp16 rounding only


@pytest.mark.parametrize("policy", ["baseline", "layerwise", "vdnn-all", "vdnn-all:codec=zvc", "gist"])
def test_the_executor_runs_it_at_the_planned_peak_and_its_gradients_agree_with_fp32(policy):
    step_half_and_full(policy, lambda: vmem.device("cpu", memory="16MiB"))


def test_a_codec_on_a_map_stored_in_fp16_counts_its_bytes_in_fp16():
    raw = vmem.plan(_net(), 8, "cpu", "vdnn-all", memory="16MiB")
    fp8 = vmem.plan(_net(), 8, "cpu", "vdnn-all:codec=fp8", memory="16MiB")
    sent = [r for r in fp8.layers if r.stash == "offload"]
    assert any(r.bytes == 2 * int(np.prod(r.shape)) for r in sent)  # an fp16 map among them
    x = _net().build(8).tensors[0]  # the input is offloaded too
    assert raw.offloaded_bytes == sum(r.bytes for r in sent) + x.nbytes
    assert fp8.offloaded_bytes == sum(int(np.prod(r.shape)) for r in sent) + x.nbytes // 4  # a byte a value


def test_weights_their_gradients_and_the_optimizers_state_are_counted_in_their_own_dtypes():
    import dataclasses

    from vmem.schedule.lower import persistent_buffers
    from vmem.schedule.steps import Kind

    program = _net(half=False).build(8)
    mixed = dataclasses.replace(program, precision=Precision("float32", "float16", "float16", "float32", "float32"))
    n = {f"{op.name}.{k}": int(np.prod(s.shape)) for op, k, s in program.owned_params()}
    for buf in persistent_buffers(mixed, ("momentum",)):
        per = {Kind.WEIGHT: 2, Kind.WEIGHT_GRAD: 2, Kind.OPT_STATE: 4}[buf.key.kind]
        assert buf.nbytes == n[buf.key.name] * per, buf
    assert mixed.param_bytes == program.param_bytes // 2


def test_nothing_outside_the_program_reads_a_single_program_dtype():
    """Byte counts come from each tensor's dtype and the Program's precision record, never one dtype."""
    import re
    from pathlib import Path

    root = Path(vmem.__file__).parent
    read = re.compile(r"\bprogram\.(dtype|itemsize)\b")
    found = [
        f"{p.relative_to(root)}:{n}"
        for p in root.rglob("*.py")
        if p.parent.name != "graph"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if read.search(line)
    ]
    assert not found
