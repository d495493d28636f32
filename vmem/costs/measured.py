"""Profiling a real device (the CPU, a CUDA GPU): measure every op, pass and algorithm, for planning with
real times.

Each layer of a Program runs on its own, on random data of the right shapes, once per algorithm it
offers (forward, backward-data and backward-filter timed apart), plus the loss, the element-wise
bandwidth (gradient accumulation, the optimizer) and the host-device copy rate. The result is a
:class:`Profiled` cost model that :func:`vmem.plan` and the dynamic policy use in place of
the roofline. On the CPU the layers run on the calling thread on host arrays; on a device, on its
compute stream, with their buffers in its pool (given back after each layer) and random data drawn
there. On a GPU with cuDNN, a convolution's algorithms are those cuDNN's heuristics rank best (see
:data:`TOP`), else those its search finds. It measures time, not memory.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from ..benchmarks import best_seconds, typical_seconds
from ..device.hostconv import HostConv
from ..errors import OutOfDeviceMemory
from ..graph import OpInfo, Program
from ..nn.base import Ctx, physical
from ..nn.ops import HostOps
from ..precision import dtype as _dtype
from ..threads import BUDGET
from .model import host_costs

__all__ = ["Profiled", "profile"]

_log = logging.getLogger("vmem.profile")  # one line per op at INFO: what a long profile is doing
#: The most workspace cuDNN's search (``Find*Ex``, the fallback where its heuristics fail) is given: it
#: runs every algorithm that fits, and some need gigabytes on a large batch, for seconds each.
FIND_WORKSPACE = 1 << 30
#: A device run at least this long is measured once: its time hardly varies, and the slowest of cuDNN's
#: algorithms on a large batch run for seconds.
_LONG = 0.02


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
        #: (:func:`vmem.engine.dispatch.overheads`); zeros until then
        self.dispatch = host_costs(dispatch)
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
        }


class _Runner:
    """Where profiled work runs and where its arrays live.

    Without a device: on the calling thread, on host arrays (``vmem.costs.profile(program)``). With one,
    every array is a block of the device's pool, so that the profile never takes more memory than the
    budget the plan is for (an op whose buffers do not fit is measured at a smaller batch: see
    :func:`_profile_fitting`); ``release`` returns the blocks after each op. On an asynchronous device (a
    GPU) the work runs on its compute stream, timed across a synchronize; on the CPU device, on the calling
    thread (its streams are idle while it profiles), timed as on the host."""

    def __init__(self, device: Any = None):
        self.device = device
        self.xp = np if device is None else device.xp
        self.conv = HostConv() if device is None else device.conv_backend
        self.ops = HostOps() if device is None else device.ops
        self.streamed = device is not None and bool(device.asynchronous)
        self.alignment = 0 if device is None else device.pool.alignment
        self.notes: list[str] = []  # what was not measured as asked (see Profiled.notes)
        self._blocks: list[Any] = []
        self._gen: Any = None  # the device's generator (made on first use)
        if device is not None:
            device.synchronize()

    def empty(self, shape: Any, dtype: Any) -> Any:
        """An array of ``shape``; on a device, in its pool (OutOfDeviceMemory where it does not fit)."""
        if self.device is None:
            return np.empty(shape, dtype)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        block = self.device.pool.allocate(max(nbytes, 1), None, "other")
        self._blocks.append(block)
        return self.device.view(block, shape, dtype)

    def array(self, host: np.ndarray) -> Any:
        if self.device is None:
            return host
        out = self.empty(host.shape, host.dtype)
        if not self.streamed:
            out[...] = host
            return out
        # in the compute stream's order; from pageable memory, so nothing goes through CuPy's pinned pool
        self.device.copy_to_device(out, np.ascontiguousarray(host), self.device.compute_stream)
        return out

    def normal(
        self, rng: np.random.Generator, shape: Any, dtype: np.dtype, scale: float = 1.0, shift: float = 0.0
    ) -> Any:
        """Random values of ``shape`` (standard normal, scaled and shifted): drawn by ``rng`` on the host;
        on a GPU, drawn there into the pool (the feature maps of a large batch are gigabytes, which a
        host generator would take a minute to draw), seeded from ``rng``."""
        if not self.streamed:
            values = (rng.standard_normal(shape) * scale + shift).astype(dtype)
            return values if self.device is None else self.array(values)
        out, xp = self.empty(shape, dtype), self.xp
        if self._gen is None:
            seed = int(rng.integers(1 << 31))
            self._gen = self.call(lambda: xp.random.default_rng(seed))  # its state made on the compute stream

        def draw() -> None:
            self._gen.standard_normal(dtype=out.dtype, out=out)
            if scale != 1.0 or shift != 0.0:
                xp.multiply(out, out.dtype.type(scale), out=out)
                xp.add(out, out.dtype.type(shift), out=out)

        self.device.compute_stream.launch(draw)
        return out

    def room(self) -> int:
        """Bytes one more array (a workspace, a probe) may take now (unlimited without a device)."""
        if self.device is None:
            return 1 << 62
        stats = self.device.pool.stats()
        margin = min(1 << 20, self.device.pool.capacity // 16) if self.streamed else 0
        return max(0, stats.largest_free - margin)

    def release(self) -> None:
        if self.device is not None:
            self.device.synchronize()
            for block in self._blocks:
                self.device.pool.free(block)
            self.device.release_cached()  # CuPy's cached temporaries, outside the arena
        self._blocks.clear()

    def call(self, fn: Any) -> Any:
        """``fn()`` where the timed runs go (on a GPU, on its compute stream, never the legacy default
        stream), waited for; its result. As a warm-up: first calls load kernels and fill caches."""
        if not self.streamed:
            return fn()
        box: list[Any] = []
        self.device.compute_stream.launch(lambda: box.append(fn()))
        self.device.compute_stream.synchronize()
        return box[0]

    def seconds(self, fn: Any, repeats: int) -> float:
        if not self.streamed:  # a step runs at its ops' typical times, not their least
            return typical_seconds(fn, repeats)
        stream = self.device.compute_stream

        def run() -> None:
            stream.launch(fn)
            stream.synchronize()

        t0 = time.perf_counter()
        run()
        first = time.perf_counter() - t0
        if first >= _LONG or repeats <= 1:
            return first
        return min(first, best_seconds(run, repeats - 1))

    def rank(self, pass_: str, layer: Any, x: Any, y_shape: Any) -> list[str]:
        """cuDNN's heuristic ranking of one pass's algorithms on maps like ``x`` (on the compute stream's
        handle)."""
        dtype = np.dtype(x.dtype).name
        return self.call(lambda: self.conv.heuristic(layer, pass_, tuple(x.shape), tuple(y_shape), dtype))

    def find(self, pass_: str, layer: Any, x: Any, w: Any, y: Any, ws: Any) -> dict[str, float]:
        """cuDNN's own timing of every algorithm of one pass of a convolution (``Find*Ex``), in seconds,
        given at most :data:`FIND_WORKSPACE` of workspace (an algorithm that needs more is not timed)."""
        if ws is not None and ws.nbytes > FIND_WORKSPACE:
            ws = ws[:FIND_WORKSPACE]
        return {name: t for name, t, _ in self.call(lambda: self.conv.find(layer, pass_, x, w, y, ws))}


def _profile_op(
    op: OpInfo,
    rng: np.random.Generator,
    dtype: np.dtype,
    repeats: int,
    times: dict[tuple[str, str, str | None], float],
    on: _Runner,
) -> None:
    """Time every pass and algorithm of one op on random data of its shapes into ``times``."""
    layer = op.layer
    # an op the device computes in another dtype than it stores (staged) is timed in that dtype, without the casts
    xs = [on.normal(rng, physical(s), op.dtype if op.staged else _dtype(d)) for s, d in zip(op.in_shapes, op.in_dtypes)]
    y = on.empty(physical(op.out_shape), op.dtype if op.staged else _dtype(op.out_dtype))
    dy = on.normal(rng, y.shape, y.dtype)
    params = {k: on.normal(rng, s.shape, dtype, 0.1, 1.0 if k == "running_var" else 0.0) for k, s in op.params.items()}
    grads = {k: on.empty(s.shape, dtype) for k, s in op.params.items() if s.trainable}
    aux = {k: on.array(np.zeros(a.shape, dtype if a.dtype == "float" else a.dtype)) for k, a in op.aux.items()}
    dxs = [on.empty(x.shape, x.dtype) for x in xs]
    algos = dict(op.algorithms or {})
    room = on.room()  # algorithms whose workspace does not fit cannot run here: never the fastest
    for pass_, names in list(algos.items()):
        for a in names:
            if op.workspace[pass_][a] > room:
                times[(op.name, pass_, a)] = float("inf")
        algos[pass_] = [a for a in names if op.workspace[pass_][a] <= room] or names[:1]
    ws_bytes = max([op.workspace[p][a] for p, names in algos.items() for a in names] + [0])
    ws = on.empty(ws_bytes, np.uint8) if ws_bytes else None

    def ctx(algo: Any) -> Ctx:
        return Ctx(
            xp=on.xp,
            params=params,
            grads=grads,
            aux=aux,
            train=True,
            rng=np.random.default_rng(0),
            workspace=ws,
            algo=algo,
            in_shapes=tuple(physical(s) for s in op.in_shapes),
            conv=on.conv,
            ops=on.ops,
        )

    needs_x = xs if op.reads_input else None
    if op.kind == "conv":
        if on.conv is not None:
            for method, strategy in (("heuristic", _profile_conv_ranked), ("find", _profile_conv_found)):
                try:
                    strategy(op, algos, ctx, xs, y, dy, dxs, needs_x, times, on, repeats, ws)
                    return
                except _NoRanking:  # the backend ranks nothing itself: its search
                    continue
                except Exception as exc:  # noqa: BLE001 - the next strategy, then each algorithm in turn
                    _log.warning("%s: profiling by the backend's %s failed (%s)", op.name, method, exc)
        _time_conv(op, algos, ctx, xs, y, dy, dxs, needs_x, times, on, repeats)
        return
    on.call(lambda: layer.forward(ctx(None), xs, y))
    times[(op.name, "forward", None)] = on.seconds(lambda: layer.forward(ctx(None), xs, y), repeats)
    y_read = y if op.reads_output else None

    def backward() -> None:
        layer.backward(ctx(None), dy, needs_x, y_read, dxs)

    on.call(backward)
    times[(op.name, "backward", None)] = on.seconds(backward, repeats)


def _time_conv(
    op: OpInfo,
    algos: dict[str, list[str]],
    ctx: Any,
    xs: list[Any],
    y: Any,
    dy: Any,
    dxs: list[Any],
    needs_x: Any,
    times: dict[tuple[str, str, str | None], float],
    on: _Runner,
    repeats: int,
) -> None:
    """Time each of ``algos`` of each pass of a convolution as the layer runs it (after a warm-up run):
    backward-filter alone, backward-data as both passes (with the fastest filter algorithm) less that.
    An algorithm that fails is skipped (never offered: its time is infinite) and named in the profile's
    notes; a pass none of whose algorithms runs raises."""
    layer = op.layer
    y_read = y if op.reads_output else None

    def timed(pass_: str, algo: str, fn: Any) -> float:
        try:
            on.call(fn)
            seconds = on.seconds(fn, repeats)
        except OutOfDeviceMemory:
            raise  # the op's buffers: measured at a smaller batch instead
        except Exception as exc:  # noqa: BLE001 - this algorithm does not run here: skip it, say so
            on.notes.append(
                f"{op.name}: {pass_} algorithm {algo} failed and is not offered "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            )
            _log.warning("%s", on.notes[-1])
            seconds = float("inf")
        times[(op.name, pass_, algo)] = seconds
        return seconds

    def usable(pass_: str) -> list[str]:
        ok = [a for a in algos[pass_] if np.isfinite(times[(op.name, pass_, a)])]
        if not ok:
            raise RuntimeError(f"{op.name}: none of the {pass_} algorithms {algos[pass_]} ran")
        return ok

    for a in algos["forward"]:
        timed("forward", a, lambda a=a: layer.forward(ctx(a), xs, y))
    usable("forward")
    data0 = algos["backward_data"][0]
    for fa in algos["backward_filter"]:
        timed("backward_filter", fa, lambda fa=fa: layer.backward(ctx((data0, fa)), dy, needs_x, y_read, [None]))
    best_filter = min(usable("backward_filter"), key=lambda a: times[(op.name, "backward_filter", a)])
    base_filter = times[(op.name, "backward_filter", best_filter)]
    for da in algos["backward_data"]:
        both = timed(
            "backward_data", da, lambda da=da: layer.backward(ctx((da, best_filter)), dy, needs_x, y_read, dxs)
        )
        times[(op.name, "backward_data", da)] = max(0.0, both - base_filter) if np.isfinite(both) else both
    usable("backward_data")


class _NoRanking(Exception):
    """The backend's heuristic ranks nothing: its search (``find``) times the algorithms instead."""


def _profile_conv_ranked(
    op: OpInfo,
    algos: dict[str, list[str]],
    ctx: Any,
    xs: list[Any],
    y: Any,
    dy: Any,
    dxs: list[Any],
    needs_x: Any,
    times: dict[tuple[str, str, str | None], float],
    on: _Runner,
    repeats: int,
    ws: Any,
) -> None:
    """A convolution on a device with cuDNN: the backend's ``ranked_top`` algorithms of each pass by cuDNN's
    heuristics (``Get*Algorithm_v7``, which runs nothing), each timed as the layer runs it. The others are
    not offered: some run for seconds on a large batch (cuDNN's own search, which runs them all, takes
    minutes on VGG-16 at batch 64)."""
    layer = op.layer
    orders = {pass_: on.rank(pass_, layer, xs[0], y.shape) for pass_ in algos}
    if not any(orders.values()):
        raise _NoRanking
    ranked = {}
    top = on.conv.ranked_top
    for pass_, names in algos.items():
        order = orders[pass_]
        ranked[pass_] = [a for a in order if a in names][:top] or names[:1]
        for a in names:
            times[(op.name, pass_, a)] = float("inf")  # not offered unless timed below
    _log.info("%s: timing %s", op.name, ranked)
    _time_conv(op, ranked, ctx, xs, y, dy, dxs, needs_x, times, on, repeats)


def _profile_conv_found(
    op: OpInfo,
    algos: dict[str, list[str]],
    ctx: Any,
    xs: list[Any],
    y: Any,
    dy: Any,
    dxs: list[Any],
    needs_x: Any,
    times: dict[tuple[str, str, str | None], float],
    on: _Runner,
    repeats: int,
    ws: Any,
) -> None:
    """A convolution on a device with cuDNN: each pass's algorithms timed by cuDNN's search (one call per
    pass, as frameworks do), then the fastest timed as the layer runs it (bias included); the others
    are given cuDNN's time plus the same overhead, so that the plan weighs them alike."""
    layer = op.layer
    y_read = y if op.reads_output else None
    w, dw = ctx(None).params["weight"], ctx(None).grads["weight"]
    found = {
        "forward": on.find("forward", layer, xs[0], w, y, ws),
        "backward_filter": on.find("backward_filter", layer, xs[0], dw, dy, ws),
        "backward_data": on.find("backward_data", layer, dxs[0], w, dy, ws),
    }
    best: dict[str, str] = {}
    for pass_, names in algos.items():
        usable = {a: found[pass_][a] for a in names if a in found[pass_]}
        if not usable:
            raise RuntimeError(f"cuDNN found none of {names} for {pass_}")
        best[pass_] = min(usable, key=lambda a: usable[a])
        for a in names:
            times[(op.name, pass_, a)] = usable.get(a, float("inf"))

    def measured(pass_: str, seconds: float) -> None:  # the fastest as the layer runs it; the rest alike
        extra = seconds - times[(op.name, pass_, best[pass_])]
        for a in algos[pass_]:
            times[(op.name, pass_, a)] = max(0.0, times[(op.name, pass_, a)] + extra)

    fwd = best["forward"]
    on.call(lambda: layer.forward(ctx(fwd), xs, y))
    measured("forward", on.seconds(lambda: layer.forward(ctx(fwd), xs, y), repeats))
    pair = (best["backward_data"], best["backward_filter"])
    on.call(lambda: layer.backward(ctx(pair), dy, needs_x, y_read, [None]))
    filter_seconds = on.seconds(lambda: layer.backward(ctx(pair), dy, needs_x, y_read, [None]), repeats)
    measured("backward_filter", filter_seconds)
    both = on.seconds(lambda: layer.backward(ctx(pair), dy, needs_x, y_read, dxs), repeats)
    measured("backward_data", max(0.0, both - filter_seconds))


def profile(
    program: Program, *, copy_gbps: float | None = None, repeats: int = 3, seed: int = 0, device: Any = None
) -> Profiled:
    """Measured costs of one training step of ``program``: on this machine's CPU (host arrays), or on
    ``device`` (the CPU device or a CUDA one: every array in its pool, its convolution backend, on a GPU its
    compute stream; the program should carry the device's catalog, ``device.catalog(program)``).

    On a device the profile never takes more memory than the device's pool has free: an op whose buffers
    do not fit at the program's batch is measured at the largest smaller batch that fits and its times
    scaled up; one that fits at no batch is estimated from the others' time per FLOP; probes (element-wise
    bandwidth, copies) are sized to the room left. ``Profiled.notes`` says what was not measured as asked.

    ``copy_gbps``: the host-device link rate if it is throttled; measured if not (a memcpy on the CPU,
    pinned copies on a GPU). On a GPU each measurement is the best of ``repeats`` runs (after a
    warm-up). On the CPU an op's time is the median of ``repeats`` runs that no other process preempted
    (up to four times as many calls to see them: :func:`vmem.benchmarks.typical_seconds`): what the op
    typically takes in a step on this machine, not its least, and never a run that lost its core to
    another process, lest a busy machine make the plan weigh an op several times over."""
    # under the same thread budget as the steps it predicts
    with BUDGET.limit() if device is None else device.step_scope():
        return _profile(program, copy_gbps, repeats, seed, device)


def _profile(program: Program, copy_gbps: float | None, repeats: int, seed: int, device: Any) -> Profiled:
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
    elementwise_gbps = _elementwise_gbps(on, np.dtype(program.precision.activations), repeats)
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

    def scaled(shape: Any) -> Any:
        shape = tuple(shape)
        return (b,) + shape[1:] if shape and shape[0] == batch else shape

    sub = dataclasses.replace(
        op,
        in_shapes=tuple(scaled(s) for s in op.in_shapes),
        out_shape=scaled(op.out_shape),
        aux={k: dataclasses.replace(a, shape=scaled(a.shape)) for k, a in op.aux.items()},
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


def _loss_seconds(program: Program, rng: np.random.Generator, dtype: np.dtype, repeats: int, on: _Runner) -> float:
    from ..nn.loss import SoftmaxCrossEntropy

    logits = on.normal(rng, program.tensors[program.output].shape, dtype)
    labels = on.array(rng.integers(0, logits.shape[1], logits.shape[0]).astype(np.int64))
    probs, dlogits = on.empty(logits.shape, np.dtype(program.loss_dtype)), on.empty(logits.shape, dtype)
    loss, xp = SoftmaxCrossEntropy(), on.xp

    def both() -> None:
        loss.forward(xp, logits, labels, probs)
        loss.backward(xp, probs, labels, dlogits)

    return on.seconds(both, repeats)


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
