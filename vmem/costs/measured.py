"""Profiling a real device (the CPU, a CUDA GPU): measure every op, pass and algorithm, for planning with
real times.

Each layer of a Program runs on its own, on random data of the right shapes, once per algorithm it
offers (forward, backward-data and backward-filter timed apart), plus the loss, the element-wise
bandwidth (gradient accumulation, the optimizer) and the host-device copy rate. The result is a
:class:`Profiled` cost model that :func:`vmem.plan` and the dynamic policy use in place of
the roofline. On the CPU the layers run on the calling thread on host arrays; on a device, on its
compute stream, with their buffers in its pool (given back after each layer) and random data drawn
there (each op timed by :mod:`.timing`). On a GPU with cuDNN, a convolution's algorithms are those cuDNN's
heuristics rank best, else those its search finds. It measures time, not memory.
"""

from __future__ import annotations

import os

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..benchmarks import best_seconds
from ..errors import OutOfDeviceMemory
from ..graph import OpInfo, Program
from .model import host_costs
from .timing import _Runner, _profile_op, _loss_seconds

if TYPE_CHECKING:
    from ..device.base import Device

__all__ = ["Profiled", "profile"]

_log = logging.getLogger("vmem.profile")  # one line per op at INFO: what a long profile is doing


class Profiled:
    """Measured costs (see :func:`profile`): op times per pass and algorithm, the copy rate of the
    host-device link (and, where the link is not throttled, the measured time of copies of the sizes the
    program offloads: small copies run from the cache, far faster than a large copy's rate), the
    element-wise bandwidth."""

    def __init__(
        self,
        times: dict[tuple[str, str, str | None], float],
        d2h_gbps: float,
        h2d_gbps: float,
        update: float = 0.0,
        elementwise_gbps: float = 10.0,
        copies: dict[int, float] | None = None,
        notes: list[str] | None = None,
        dispatch: tuple[float, ...] = (0.0, 0.0, 0.0),
        codec_offload: bool = False,
        busy_elsewhere: float | None = None,
    ):
        self.times = times
        self.d2h = d2h_gbps
        self.h2d = h2d_gbps
        self.update = update
        self.elementwise_gbps = elementwise_gbps
        self.copies = copies or {}  # bytes -> seconds of one copy of that size
        #: what was not measured as asked (an op at a smaller batch, a smaller probe), one line each
        self.notes = list(notes or [])
        #: the host's part of a step on a device whose streams wait for the host (the CPU device):
        #: (seconds to enqueue one schedule step, seconds a stream spends on an item besides its work,
        #: seconds the compute stream loses to each copy the memory stream runs), measured by the session
        #: (:func:`vmem.engine.probe.overheads`); zeros until then
        self.dispatch = host_costs(dispatch)
        #: the cores other processes kept busy on average while the profile measured (None: not known);
        #: from :data:`vmem.costs.cpuload.DISTURBED` on, the profile is disturbed and its notes say so
        self.busy_elsewhere = busy_elsewhere
        #: whether offloading through a codec can save time (see vmem.policies.auto.codec_offloads): not
        #: where the host's cores run the ops (the CPU device: the link is a memory copy on those cores,
        #: and a codec's kernels would take them too); set by :func:`profile` (a named policy still
        #: offloads through a codec where asked)
        self.codec_offload = codec_offload

    def host_overheads(self) -> tuple[float, float, float]:
        return self.dispatch

    def op_seconds(self, op: OpInfo, pass_: str, algo: str | None) -> float:
        key = (op.name, pass_, algo)
        if key in self.times:
            return self.times[key]
        return self.times.get((op.name, pass_, None), 0.0)

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        if nbytes in self.copies:
            return self.copies[nbytes]
        return nbytes / ((self.d2h if direction == "d2h" else self.h2d) * 1e9)

    def update_seconds(self, param_bytes: int) -> float:
        return self.update

    def misc_seconds(self, kind: str, nbytes: int) -> float:
        if kind in ("acc", "encode", "decode"):
            return (3 if kind == "acc" else 1) * nbytes / (self.elementwise_gbps * 1e9)
        return self.times.get((kind, "forward", None), 0.0)

    def scaled(self, factor: float) -> "Profiled":
        """These costs for a batch ``factor`` times the profiled one: every op's time scaled by it (the update,
        the rates and the host's overheads do not depend on the batch). An estimate, for what only asks
        whether a plan fits at another batch (:func:`vmem.planning.largest_batch`), not how fast it runs."""
        return Profiled(
            {k: t * factor for k, t in self.times.items()},
            d2h_gbps=self.d2h,
            h2d_gbps=self.h2d,
            update=self.update,
            elementwise_gbps=self.elementwise_gbps,
            copies={},  # a copy of another size: at the link's rate
            notes=[*self.notes, f"op times scaled by {factor:g} from the profiled batch"],
            dispatch=self.dispatch,
            codec_offload=self.codec_offload,
            busy_elsewhere=self.busy_elsewhere,
        )

    @property
    def disturbed(self) -> bool:
        """Whether other processes kept a quarter of a core or more busy while it measured."""
        from .cpuload import DISTURBED

        return self.busy_elsewhere is not None and self.busy_elsewhere >= DISTURBED

    def to_dict(self) -> dict[str, Any]:
        """Everything measured, as plain data (:func:`vmem.costs.cache.parse` reads it back, checked)."""
        return {
            # an algorithm not offered (infinite time) as null: the file stays standard JSON
            "times": [
                [op, pass_, algo, None if t == float("inf") else t] for (op, pass_, algo), t in self.times.items()
            ],
            "d2h_gbps": self.d2h,
            "h2d_gbps": self.h2d,
            "update": self.update,
            "elementwise_gbps": self.elementwise_gbps,
            "copies": [[n, t] for n, t in self.copies.items()],
            "notes": self.notes,
            "dispatch": list(self.dispatch),
            "codec_offload": self.codec_offload,
            "busy_elsewhere": self.busy_elsewhere,
        }


def profile(
    program: Program, *, device: Device, copy_gbps: float | None = None, repeats: int = 3, seed: int = 0
) -> Profiled:
    """Measured costs of one training step of ``program`` on ``device`` (the CPU device or a CUDA one: every array in its pool, its convolution backend, on a GPU its
    compute stream; the program should carry the device's catalog, ``device.catalog(program)``).

    The profile never takes more memory than the device's pool has free: an op whose buffers
    do not fit at the program's batch is measured at the largest smaller batch that fits and its times
    scaled up; one that fits at no batch is estimated from the others' time per FLOP; probes (element-wise
    bandwidth, copies) are sized to the room left. ``Profiled.notes`` says what was not measured as asked.

    ``copy_gbps``: the host-device link rate if it is throttled; measured if not (a memcpy on the CPU,
    pinned copies on a GPU). On a GPU each measurement is the best of ``repeats`` runs (after a
    warm-up). On the CPU an op's time is the median of ``repeats`` runs that no other process preempted
    (up to four times as many calls to see them: :func:`vmem.benchmarks.typical_seconds`): what the op
    typically takes in a step on this machine, not its least, and never a run that lost its core to
    another process, lest a busy machine make the plan weigh an op several times over. Where other processes
    kept cores busy while it measured (``/proc/stat``: :mod:`vmem.costs.cpuload`), ``busy_elsewhere`` says how
    many on average and, from a quarter of one, a note says the profile was disturbed (a profile quicker than
    :data:`~vmem.costs.cpuload.SHORTEST` watches the machine until then, so that the count can tell)."""
    from . import cpuload

    before = cpuload.sample()
    with device.step_scope():  # under the same thread budget as the steps it predicts
        profiled = _profile(program, copy_gbps, repeats, seed, device)
    if before is not None:  # quicker than the kernel's count can tell: the machine watched a little longer
        time.sleep(max(0.0, before.at + cpuload.SHORTEST - time.perf_counter()))
    profiled.busy_elsewhere = cpuload.busy_elsewhere(before, cpuload.sample())
    if profiled.disturbed:
        profiled.notes.append(disturbed_note(profiled.busy_elsewhere))
    return profiled


def disturbed_note(busy: float | None) -> str:
    """What a profile taken while other processes used the machine says of itself."""
    return (
        f"taken while other processes used {busy or 0:.2f} of its {os.cpu_count()} cores on average: its "
        "times may be high and the plan made from it off; profile again on a quiet machine "
        "(VMEM_PROFILE_CACHE=0 measures afresh)"
    )


def _profile(program: Program, copy_gbps: float | None, repeats: int, seed: int, device: Device) -> Profiled:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(program.precision.parameters)  # the layers' weights; each op's data in its own dtypes
    on = _Runner(device)
    times: dict[tuple[str, str, str | None], float] = {}
    notes = on.notes  # what was not measured as asked, said by whatever measured it
    unmeasured = []
    for op in program.ops:
        t0 = time.perf_counter()
        if not _profile_fitting(program, op, rng, dtype, repeats, times, on):
            unmeasured.append(op)
        _log.info("%s (%s): %.2f s", op.name, op.kind, time.perf_counter() - t0)
    _estimate(program, unmeasured, times, notes)
    try:
        logits = np.dtype(program.tensors[program.output].dtype)
        times[("loss", "forward", None)] = _loss_seconds(program, rng, logits, repeats, on)
    except OutOfDeviceMemory:
        times[("loss", "forward", None)] = 0.0
        notes.append("loss: not measured (its buffers do not fit the device's free memory); taken as free")
    finally:
        on.release()
    # in the master weights' type: the update and gradient accumulation run there (a half-precision add is
    # a kernel of its own, which CuPy compiles on first use)
    elementwise_gbps = _elementwise_gbps(on, np.dtype(program.precision.master), repeats)
    copies = {}
    if copy_gbps is None:
        copy_gbps = _copy_gbps(on, repeats)
        if not on.streamed:  # unthrottled CPU copies: time each size the program may offload
            copies = _copy_times(program, repeats)
    params_bytes = sum(int(np.prod(s.shape)) for _, _, s in program.owned_params() if s.trainable)
    update = 5 * params_bytes * program.precision.itemsize("master") / (elementwise_gbps * 1e9)
    for note in notes:
        _log.info("profile: %s", note)
    return Profiled(
        times,
        d2h_gbps=copy_gbps,
        h2d_gbps=copy_gbps,
        update=update,
        elementwise_gbps=elementwise_gbps,
        copies=copies,
        notes=notes,
        codec_offload=on.streamed,  # a GPU's codec kernels run beside its copy engine
    )


def _profile_fitting(
    program: Program,
    op: OpInfo,
    rng: np.random.Generator,
    dtype: np.dtype,
    repeats: int,
    times: dict[tuple[str, str, str | None], float],
    on: _Runner,
) -> bool:
    """Profile ``op`` at the program's batch, else at the largest batch (halving) whose buffers fit the
    device's free memory, its times scaled by the ratio of batches; False where none fits."""
    batch = program.batch
    b = batch
    while True:
        sub = op if b == batch else _at_batch(program, op, b, on)
        measured: dict[tuple[str, str, str | None], float] = {}
        try:
            _profile_op(sub, rng, dtype, repeats, measured, on)
        except OutOfDeviceMemory as exc:
            if b == 1:
                on.notes.append(
                    f"{op.name}: not measured: its buffers do not fit the device's free memory even at batch "
                    f"1 ({exc.requested:,} bytes asked, {exc.largest_free:,} free in one block); estimated "
                    "from the other layers' time per FLOP"
                )
                return False
            b = max(1, b // 2)
            continue
        finally:
            on.release()
        scale = batch / b
        times.update({key: t * scale for key, t in measured.items()})
        if b < batch:
            on.notes.append(
                f"{op.name}: measured at batch {b} of {batch} (its buffers do not fit the device's free "
                f"memory at {batch}), times scaled by {scale:g}"
            )
        return True


def _at_batch(program: Program, op: OpInfo, b: int, on: _Runner) -> OpInfo:
    """``op`` at batch ``b``: its activations' and saved state's leading dimension, and its algorithms'
    workspace for that batch (the device's catalog where it has one)."""
    batch = program.batch

    def scaled(shape: Sequence[int]) -> tuple[int, ...]:
        shape = tuple(shape)
        return (b,) + shape[1:] if shape and shape[0] == batch else shape

    in_shapes = tuple(scaled(s) for s in op.in_shapes)
    # the saved state as the layer sizes it for these inputs: per channel (batch norm's statistics, whose
    # length may equal the batch), per row, or one flat array over every value (dropout's mask bits)
    sub = dataclasses.replace(
        op, in_shapes=in_shapes, out_shape=scaled(op.out_shape), aux=op.layer.aux_specs(in_shapes)
    )
    if on.conv is not None and op.kind == "conv":  # the device's algorithms and their workspace at batch b
        sub = on.conv.catalog(dataclasses.replace(program, ops=[sub], batch=b)).ops[0]
    return sub


def _estimate(
    program: Program, ops: list[OpInfo], times: dict[tuple[str, str, str | None], float], notes: list[str]
) -> None:
    """Times for ops that could not be measured: their FLOPs at the measured ops' median time per FLOP,
    every pass and algorithm of a convolution alike, another op's backward twice its forward."""
    if not ops:
        return
    rates = [
        times[(op.name, "forward", a)] / op.flops
        for op in program.ops
        if op.flops and op not in ops
        for a in (op.algorithms.get("forward") or [None])  # type: ignore[list-item]  # None: no algorithm
        if (op.name, "forward", a) in times and np.isfinite(times[(op.name, "forward", a)])
    ]
    per_flop = float(np.median(rates)) if rates else 1e-10
    for op in ops:
        seconds = op.flops * per_flop
        if op.algorithms:
            for pass_, names in op.algorithms.items():
                for a in names:
                    times[(op.name, pass_, a)] = seconds
        else:
            times[(op.name, "forward", None)] = seconds
            times[(op.name, "backward", None)] = 2 * seconds


def _elementwise_gbps(on: _Runner, dtype: np.dtype, repeats: int) -> float:
    """Element-wise bandwidth (gradient accumulation, the optimizer's update): an add over two arrays of up
    to 16 MiB each, smaller where the device has less room."""
    n = min(4 << 20, max(0, on.room() - 2 * on.alignment) // (2 * dtype.itemsize))
    if n < 4096:
        on.notes.append(
            f"element-wise bandwidth: not measured (no room for two arrays of 4096 values); taken as "
            f"{_DEFAULT_GBPS:g} GB/s"
        )
        return _DEFAULT_GBPS
    try:
        a = on.array(np.ones(n, dtype))
        b = on.array(np.ones(n, dtype))
        add_seconds = on.seconds(lambda: on.xp.add(a, b, out=a), repeats)
    finally:
        on.release()
    if n < 4 << 20:
        on.notes.append(f"element-wise bandwidth: measured on {n * dtype.itemsize:,}-byte arrays (16 MiB asked)")
    return 3 * n * dtype.itemsize / max(add_seconds, 1e-9) / 1e9


#: GB/s taken for element-wise work where there is no room to measure it
_DEFAULT_GBPS = 10.0


def _copy_times(program: Program, repeats: int) -> dict[int, float]:
    """Seconds of one copy of each size of the program's stashed buffers (what offloads move)."""
    out = {}
    for b in program.stashed_buffers():
        n = max(program.tensors[b].nbytes, 1)
        if n not in out:
            src, dst = np.ones(n, np.uint8), np.empty(n, np.uint8)
            out[n] = best_seconds(lambda: np.copyto(dst, src, casting="no"), repeats + 1)
    return out


def _copy_gbps(on: _Runner, repeats: int) -> float:
    """The link rate: a 32 MiB memcpy on the CPU (the CPU device's copies are memcpys on its memory
    stream); pinned copies (the slower direction) on a GPU, of up to 32 MiB, less where the pool has less
    room."""
    if not on.streamed:
        src = np.ones(32 << 20, np.uint8)
        dst = np.empty_like(src)
        return src.nbytes / best_seconds(lambda: np.copyto(dst, src), repeats) / 1e9
    from ..benchmarks import bandwidth

    room = on.room()
    size = min(32 << 20, room - room % (1 << 20) if room >= 2 << 20 else room - room % 4096)
    if size < 4096:
        on.notes.append(f"host link: not measured (no room in the device's pool); taken as {_DEFAULT_GBPS:g} GB/s")
        return _DEFAULT_GBPS
    if size < 32 << 20:
        on.notes.append(f"host link: measured with {size:,}-byte copies (32 MiB asked)")
    row = bandwidth(on.device, [size], rounds=repeats)[0]
    return min(row["d2h_pinned_gbps"], row["h2d_pinned_gbps"])
