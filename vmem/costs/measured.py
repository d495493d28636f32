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

import logging
import time
from typing import Any

import numpy as np

from ..benchmarks import best_seconds
from ..graph import OpInfo, Program
from ..nn.base import Ctx, physical
from ..threads import BUDGET

__all__ = ["Profiled", "profile"]

_log = logging.getLogger("vmem.profile")  # one line per op at INFO: what a long profile is doing
#: A device run at least this long is measured once: its time hardly varies, and the slowest of cuDNN's
#: algorithms on a large batch run for seconds.
_LONG = 0.02


class Profiled:
    """Measured costs (see :func:`profile`): op times per pass and algorithm, the copy rate of the
    host-device link (and, where the link is not throttled, the measured time of copies of the sizes the
    program offloads: small copies run from the cache, far faster than a large copy's rate), the
    element-wise bandwidth."""

    def __init__(self, times: dict[tuple[str, str, str | None], float], d2h_gbps: float, h2d_gbps: float,
                 update: float = 0.0, elementwise_gbps: float = 10.0, copies: dict[int, float] | None = None):
        self.times = times
        self.d2h = d2h_gbps
        self.h2d = h2d_gbps
        self.update = update
        self.elementwise_gbps = elementwise_gbps
        self.copies = copies or {}  # bytes -> seconds of one copy of that size

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
            return (3 if kind == "acc" else 1.5) * nbytes / (self.elementwise_gbps * 1e9)
        return self.times.get((kind, "forward", None), 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"times": {"|".join(str(p) for p in k): v for k, v in self.times.items()},
                "d2h_gbps": self.d2h, "h2d_gbps": self.h2d, "update": self.update}


class _Runner:
    """Where profiled work runs: on the calling thread (the CPU, by default), or on a device's compute
    stream, timed across a synchronize, with its arrays in the device's pool (a CUDA device's arena holds
    nearly all of the GPU's memory); ``release`` returns them after each op."""

    def __init__(self, device: Any = None):
        self.device = device
        self.xp = np if device is None else device.xp
        self.conv = None if device is None else device.conv_backend
        self._blocks: list[Any] = []
        self._gen: Any = None  # the device's generator (made on first use)

    def empty(self, shape: Any, dtype: Any) -> Any:
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
        xp = self.xp
        self.device.compute_stream.launch(lambda: out.__setitem__(Ellipsis, xp.asarray(host)))  # in stream order
        return out

    def normal(self, rng: np.random.Generator, shape: Any, dtype: np.dtype, scale: float = 1.0,
               shift: float = 0.0) -> Any:
        """Random values of ``shape`` (standard normal, scaled and shifted): drawn by ``rng`` on the CPU;
        on a device, drawn there into the pool (the feature maps of a large batch are gigabytes, which a
        host generator would take a minute to draw), seeded from ``rng``."""
        if self.device is None:
            return (rng.standard_normal(shape) * scale + shift).astype(dtype)
        out, xp = self.empty(shape, dtype), self.xp
        if self._gen is None:
            self._gen = xp.random.default_rng(int(rng.integers(1 << 31)))

        def draw() -> None:
            self._gen.standard_normal(dtype=out.dtype, out=out)
            if scale != 1.0 or shift != 0.0:
                xp.multiply(out, out.dtype.type(scale), out=out)
                xp.add(out, out.dtype.type(shift), out=out)

        self.device.compute_stream.launch(draw)
        return out

    def room(self) -> int:
        """Bytes a workspace may take now (unlimited on the CPU)."""
        if self.device is None:
            return 1 << 62
        stats = self.device.pool.stats()
        return max(0, stats.largest_free - (1 << 20))

    def release(self) -> None:
        if self.device is not None:
            self.device.synchronize()
            for block in self._blocks:
                self.device.pool.free(block)
            if hasattr(self.device, "release_cached"):  # CuPy's cached temporaries, outside the arena
                self.device.release_cached()
        self._blocks.clear()

    def call(self, fn: Any) -> Any:
        """``fn()`` where the timed runs go (on a device, on its compute stream, never the legacy default
        stream), waited for; its result. As a warm-up: first calls load kernels and fill caches."""
        if self.device is None:
            return fn()
        box: list[Any] = []
        self.device.compute_stream.launch(lambda: box.append(fn()))
        self.device.compute_stream.synchronize()
        return box[0]

    def seconds(self, fn: Any, repeats: int) -> float:
        if self.device is None:
            return best_seconds(fn, repeats, undisturbed=True)
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

    def rank(self, pass_: str, layer: Any, x_shape: Any, y_shape: Any) -> list[str]:
        """cuDNN's heuristic ranking of one pass's algorithms (on the compute stream's handle)."""
        return self.call(lambda: self.conv.heuristic(layer, pass_, tuple(x_shape), tuple(y_shape)))

    def find(self, pass_: str, layer: Any, x: Any, w: Any, y: Any, ws: Any) -> dict[str, float]:
        """cuDNN's own timing of every algorithm of one pass of a convolution (``Find*Ex``), in seconds."""
        return {name: t for name, t, _ in self.call(lambda: self.conv.find(layer, pass_, x, w, y, ws))}


def _profile_op(op: OpInfo, rng: np.random.Generator, dtype: np.dtype, repeats: int,
                times: dict[tuple[str, str, str | None], float], on: _Runner) -> None:
    """Time every pass and algorithm of one op on random data of its shapes into ``times``."""
    layer = op.layer
    xs = [on.normal(rng, physical(s), dtype) for s in op.in_shapes]
    y = on.empty(physical(op.out_shape), dtype)
    dy = on.normal(rng, y.shape, dtype)
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
        return Ctx(xp=on.xp, params=params, grads=grads, aux=aux, train=True, rng=np.random.default_rng(0),
                   workspace=ws, algo=algo, in_shapes=tuple(physical(s) for s in op.in_shapes), conv=on.conv)

    needs_x = xs if op.reads_input else None
    if op.kind == "conv":
        if on.conv is not None:
            for method, strategy in (("heuristic", _profile_conv_ranked), ("find", _profile_conv_found)):
                if not hasattr(on.conv, method):
                    continue
                try:
                    strategy(op, algos, ctx, xs, y, dy, dxs, needs_x, times, on, repeats, ws)
                    return
                except Exception as exc:  # noqa: BLE001 - the next strategy, then each algorithm in turn
                    _log.warning("%s: profiling by cuDNN's %s failed (%s)", op.name, method, exc)
        _time_conv(op, algos, ctx, xs, y, dy, dxs, needs_x, times, on, repeats)
        return
    on.call(lambda: layer.forward(ctx(None), xs, y))
    times[(op.name, "forward", None)] = on.seconds(lambda: layer.forward(ctx(None), xs, y), repeats)
    y_read = y if op.reads_output else None

    def backward() -> None:
        layer.backward(ctx(None), dy, needs_x, y_read, dxs)
    on.call(backward)
    times[(op.name, "backward", None)] = on.seconds(backward, repeats)


def _time_conv(op: OpInfo, algos: dict[str, list[str]], ctx: Any, xs: list[Any], y: Any, dy: Any, dxs: list[Any],
               needs_x: Any, times: dict[tuple[str, str, str | None], float], on: _Runner, repeats: int) -> None:
    """Time each of ``algos`` of each pass of a convolution as the layer runs it (after a warm-up run):
    backward-filter alone, backward-data as both passes (with the fastest filter algorithm) less that."""
    layer = op.layer
    y_read = y if op.reads_output else None
    for a in algos["forward"]:
        on.call(lambda a=a: layer.forward(ctx(a), xs, y))
        times[(op.name, "forward", a)] = on.seconds(lambda a=a: layer.forward(ctx(a), xs, y), repeats)
    data0 = algos["backward_data"][0]
    for fa in algos["backward_filter"]:
        def filter_only(fa: str = fa) -> None:
            layer.backward(ctx((data0, fa)), dy, needs_x, y_read, [None])
        on.call(filter_only)
        times[(op.name, "backward_filter", fa)] = on.seconds(filter_only, repeats)
    best_filter = min(algos["backward_filter"], key=lambda a: times[(op.name, "backward_filter", a)])
    base_filter = times[(op.name, "backward_filter", best_filter)]
    for da in algos["backward_data"]:
        def both(da: str = da) -> None:
            layer.backward(ctx((da, best_filter)), dy, needs_x, y_read, dxs)
        on.call(both)
        times[(op.name, "backward_data", da)] = max(0.0, on.seconds(both, repeats) - base_filter)


#: Algorithms per pass timed on a device with cuDNN: the best of its heuristics' ranking (a backend may
#: say otherwise: ``ranked_top``). The others are not offered (some run for seconds on a large batch:
#: cuDNN's own search, which runs them all, takes minutes on VGG-16 at batch 64).
TOP = 3


def _profile_conv_ranked(op: OpInfo, algos: dict[str, list[str]], ctx: Any, xs: list[Any], y: Any, dy: Any,
                         dxs: list[Any], needs_x: Any, times: dict[tuple[str, str, str | None], float],
                         on: _Runner, repeats: int, ws: Any) -> None:
    """A convolution on a device with cuDNN: the :data:`TOP` algorithms of each pass by cuDNN's heuristics
    (``Get*Algorithm_v7``, which runs nothing), each timed as the layer runs it."""
    layer = op.layer
    ranked = {}
    top = getattr(on.conv, "ranked_top", TOP)
    for pass_, names in algos.items():
        order = on.rank(pass_, layer, xs[0].shape, y.shape)
        ranked[pass_] = [a for a in order if a in names][:top] or names[:1]
        for a in names:
            times[(op.name, pass_, a)] = float("inf")  # not offered unless timed below
    _log.info("%s: timing %s", op.name, ranked)
    _time_conv(op, ranked, ctx, xs, y, dy, dxs, needs_x, times, on, repeats)


def _profile_conv_found(op: OpInfo, algos: dict[str, list[str]], ctx: Any, xs: list[Any], y: Any, dy: Any,
                        dxs: list[Any], needs_x: Any, times: dict[tuple[str, str, str | None], float], on: _Runner,
                        repeats: int, ws: Any) -> None:
    """A convolution on a device with cuDNN: each pass's algorithms timed by cuDNN's search (one call per
    pass, as frameworks do), then the fastest timed as the layer runs it (bias included); the others
    are given cuDNN's time plus the same overhead, so that the plan weighs them alike."""
    layer = op.layer
    y_read = y if op.reads_output else None
    w, dw = ctx(None).params["weight"], ctx(None).grads["weight"]
    found = {"forward": on.find("forward", layer, xs[0], w, y, ws),
             "backward_filter": on.find("backward_filter", layer, xs[0], dw, dy, ws),
             "backward_data": on.find("backward_data", layer, dxs[0], w, dy, ws)}
    best: dict[str, str] = {}
    for pass_, names in algos.items():
        usable = {a: found[pass_][a] for a in names if a in found[pass_]}
        if not usable:
            raise RuntimeError(f"cuDNN found none of {names} for {pass_}")
        best[pass_] = min(usable, key=usable.get)
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


def profile(program: Program, *, copy_gbps: float | None = None, repeats: int = 3, seed: int = 0,
            device: Any = None) -> Profiled:
    """Measured costs of one training step of ``program``: on this machine's CPU, or on ``device`` (a
    CUDA device: its arrays, its convolution backend, its compute stream; the program should carry the
    device's catalog, ``device.catalog(program)``).

    ``copy_gbps``: the host-device link rate if it is throttled; measured if not (a memcpy on the CPU,
    pinned copies on a device). Each measurement is the best of ``repeats`` runs (after a warm-up); on
    the CPU, of more where those were all preempted by other processes (up to four times as many: see
    :func:`vmem.benchmarks.best_seconds`), lest a busy machine make the plan weigh an op several times
    over."""
    # under the same thread budget as the steps it predicts
    with (BUDGET.limit() if device is None else device.step_scope()):
        return _profile(program, copy_gbps, repeats, seed, device)


def _profile(program: Program, copy_gbps: float | None, repeats: int, seed: int, device: Any) -> Profiled:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(program.dtype)
    on = _Runner(device)
    times: dict[tuple[str, str, str | None], float] = {}
    for op in program.ops:
        t0 = time.perf_counter()
        try:
            _profile_op(op, rng, dtype, repeats, times, on)
        finally:
            on.release()
        _log.info("%s (%s): %.2f s", op.name, op.kind, time.perf_counter() - t0)
    try:
        times[("loss", "forward", None)] = _loss_seconds(program, rng, dtype, repeats, on)
        # element-wise bandwidth (gradient accumulation, the optimizer's update) and the copy rate
        a = on.array(np.ones(4 << 20, dtype))
        b = on.array(np.ones(4 << 20, dtype))
        add_seconds = on.seconds(lambda: on.xp.add(a, b, out=a), repeats)
    finally:
        on.release()
    elementwise_gbps = 3 * a.nbytes / add_seconds / 1e9
    copies = {}
    if copy_gbps is None:
        copy_gbps = _copy_gbps(device, repeats)
        if device is None:  # unthrottled CPU copies: time each size the program may offload
            copies = _copy_times(program, repeats)
    params_bytes = sum(int(np.prod(s.shape)) for _, _, s in program.owned_params() if s.trainable)
    update = 5 * params_bytes * dtype.itemsize / (elementwise_gbps * 1e9)
    return Profiled(times, d2h_gbps=copy_gbps, h2d_gbps=copy_gbps, update=update, elementwise_gbps=elementwise_gbps,
                    copies=copies)


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
    probs, dlogits = on.empty(logits.shape, dtype), on.empty(logits.shape, dtype)
    loss, xp = SoftmaxCrossEntropy(), on.xp
    return on.seconds(lambda: (loss.forward(xp, logits, labels, probs), loss.backward(xp, probs, labels, dlogits)),
                      repeats)


def _copy_gbps(device: Any, repeats: int) -> float:
    """The link rate: a 32 MiB memcpy on the CPU; pinned copies (the slower direction) on a device."""
    if device is None:
        src = np.ones(32 << 20, np.uint8)
        dst = np.empty_like(src)
        return src.nbytes / best_seconds(lambda: np.copyto(dst, src), repeats) / 1e9
    from ..benchmarks import bandwidth

    row = bandwidth(device, [32 << 20], rounds=repeats)[0]
    return min(row["d2h_pinned_gbps"], row["h2d_pinned_gbps"])
