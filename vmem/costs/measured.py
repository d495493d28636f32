"""Profiling on the CPU device: measure every op, pass and algorithm, for planning with real times.

Each layer of a Program runs on its own, on random data of the right shapes, once per algorithm it
offers (forward, backward-data and backward-filter timed apart), plus the loss, the element-wise
bandwidth (gradient accumulation, the optimizer) and the host-device copy rate. The result is a
:class:`Profiled` cost model that :func:`vmem.plan` and the dynamic policy use in place of
the roofline. Profiling buffers are ordinary host arrays, outside the device arena: it measures time,
not memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..benchmarks import best_seconds
from ..graph import OpInfo, Program
from ..nn.base import Ctx, physical

__all__ = ["Profiled", "profile"]


class Profiled:
    """Measured costs (the CPU device, see :func:`vmem.profile.profile`): op times per pass and
    algorithm, the copy rate of the host-device link, the element-wise bandwidth."""

    def __init__(self, times: dict[tuple[str, str, str | None], float], d2h_gbps: float, h2d_gbps: float,
                 update: float = 0.0, elementwise_gbps: float = 10.0):
        self.times = times
        self.d2h = d2h_gbps
        self.h2d = h2d_gbps
        self.update = update
        self.elementwise_gbps = elementwise_gbps

    def op_seconds(self, op: OpInfo, pass_: str, algo: str | None) -> float:
        key = (op.name, pass_, algo)
        if key in self.times:
            return self.times[key]
        return self.times.get((op.name, pass_, None), 0.0)

    def copy_seconds(self, nbytes: int, direction: str) -> float:
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


def _profile_op(op: OpInfo, rng: np.random.Generator, dtype: np.dtype, repeats: int,
                times: dict[tuple[str, str, str | None], float]) -> None:
    """Time every pass and algorithm of one op on random data of its shapes into ``times``."""
    layer = op.layer
    xs = [rng.standard_normal(physical(s)).astype(dtype) for s in op.in_shapes]
    y = np.empty(physical(op.out_shape), dtype)
    dy = rng.standard_normal(y.shape).astype(dtype)
    params = {k: (rng.standard_normal(s.shape) * 0.1 + (1.0 if k == "running_var" else 0.0)).astype(dtype)
              for k, s in op.params.items()}
    grads = {k: np.empty(s.shape, dtype) for k, s in op.params.items() if s.trainable}
    aux = {k: np.zeros(a.shape, dtype if a.dtype == "float" else a.dtype) for k, a in op.aux.items()}
    dxs = [np.empty_like(x) for x in xs]
    algos = op.algorithms or {}
    ws_bytes = max([b for per in op.workspace.values() for b in per.values()] + [0])
    ws = np.empty(ws_bytes, np.uint8) if ws_bytes else None

    def ctx(algo: Any) -> Ctx:
        return Ctx(xp=np, params=params, grads=grads, aux=aux, train=True, rng=np.random.default_rng(0),
                   workspace=ws, algo=algo, in_shapes=tuple(physical(s) for s in op.in_shapes))

    needs_x = xs if op.reads_input else None
    for algo in algos.get("forward", [None]):
        layer.forward(ctx(algo), xs, y)  # warm up
        times[(op.name, "forward", algo)] = best_seconds(lambda: layer.forward(ctx(algo), xs, y), repeats)
    y_read = y if op.reads_output else None
    if op.kind != "conv":
        def backward() -> None:
            layer.backward(ctx(None), dy, needs_x, y_read, dxs)
        backward()
        times[(op.name, "backward", None)] = best_seconds(backward, repeats)
        return
    data_algos, filter_algos = algos["backward_data"], algos["backward_filter"]
    for fa in filter_algos:
        def filter_only(fa: str = fa) -> None:
            layer.backward(ctx((data_algos[0], fa)), dy, needs_x, y_read, [None])
        filter_only()
        times[(op.name, "backward_filter", fa)] = best_seconds(filter_only, repeats)
    base_filter = times[(op.name, "backward_filter", filter_algos[0])]
    for da in data_algos:  # backward-data: both passes, less the filter pass alone
        def both(da: str = da) -> None:
            layer.backward(ctx((da, filter_algos[0])), dy, needs_x, y_read, dxs)
        both()
        times[(op.name, "backward_data", da)] = max(0.0, best_seconds(both, repeats) - base_filter)


def profile(program: Program, *, copy_gbps: float | None = None, repeats: int = 2, seed: int = 0) -> Profiled:
    """Measured costs of one training step of ``program`` on this machine's CPU.

    ``copy_gbps``: the device's host-device link rate if it is throttled; measured with a memcpy if not.
    Each measurement is the best of ``repeats`` runs (after one warm-up run)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(program.dtype)
    times: dict[tuple[str, str, str | None], float] = {}
    for op in program.ops:
        _profile_op(op, rng, dtype, repeats, times)

    # the loss, on the logits' shape
    from ..nn.loss import SoftmaxCrossEntropy

    logits = rng.standard_normal(program.tensors[program.output].shape).astype(dtype)
    labels = rng.integers(0, logits.shape[1], logits.shape[0])
    probs, dlogits = np.empty_like(logits), np.empty_like(logits)
    loss = SoftmaxCrossEntropy()
    times[("loss", "forward", None)] = best_seconds(lambda: (loss.forward(np, logits, labels, probs),
                                                      loss.backward(np, probs, labels, dlogits)), repeats)
    # element-wise bandwidth (gradient accumulation, the optimizer's update) and the copy rate
    a = np.ones(4 << 20, dtype)
    b = np.ones_like(a)
    add_seconds = best_seconds(lambda: np.add(a, b, out=a), repeats)
    elementwise_gbps = 3 * a.nbytes / add_seconds / 1e9
    if copy_gbps is None:
        src = np.ones(32 << 20, np.uint8)
        dst = np.empty_like(src)
        copy_gbps = src.nbytes / best_seconds(lambda: np.copyto(dst, src), repeats) / 1e9
    params_bytes = sum(int(np.prod(s.shape)) for op in program.ops for s in op.params.values() if s.trainable)
    update = 5 * params_bytes * dtype.itemsize / (elementwise_gbps * 1e9)
    return Profiled(times, d2h_gbps=copy_gbps, h2d_gbps=copy_gbps, update=update, elementwise_gbps=elementwise_gbps)
