"""Finite-difference gradient checks of a single layer in float64 (Chainer's check_backward, in small)."""

from __future__ import annotations

import numpy as np

from vmem.device.hostconv import HostConv, workspace_bytes
from vmem.nn import Ctx, physical

PASSES = ("forward", "backward_data", "backward_filter")


def make_ctx(layer, in_shapes, rng, algo=None, train=True, seed=7):
    specs = layer.param_specs(in_shapes)
    params = {
        k: rng.standard_normal(s.shape) * (0.5 if s.trainable else 0.1) + (1.0 if k == "running_var" else 0.0)
        for k, s in specs.items()
    }
    if "running_var" in params:
        params["running_var"] = np.abs(params["running_var"]) + 0.5
    grads = {k: np.zeros(s.shape) for k, s in specs.items() if s.trainable}
    aux = {
        k: np.zeros(a.shape, dtype=np.float64 if a.dtype == "float" else a.dtype)
        for k, a in layer.aux_specs(in_shapes).items()
    }
    algos = algo if isinstance(algo, tuple) else (algo,)
    conv = layer.kind == "conv"  # run by the host's convolutions (the CPU device's backend)
    ws_bytes = max([workspace_bytes(layer, in_shapes[0], p, a, 8) for p in PASSES for a in algos if conv] + [0])
    ctx = Ctx(
        xp=np,
        params=params,
        grads=grads,
        aux=aux,
        train=train,
        workspace=np.zeros(ws_bytes, np.uint8) if ws_bytes else None,
        algo=algo,
        in_shapes=tuple(physical(s) for s in in_shapes),
        conv=HostConv(),
    )
    ctx.seed = seed
    return ctx


def run_forward(layer, ctx, xs, out_shape):
    ctx.rng = np.random.default_rng(ctx.seed)  # the same dropout mask on every call
    y = np.zeros(physical(out_shape))
    layer.forward(ctx, [x.copy() for x in xs], y)
    return y


def check_layer(layer, in_shapes, *, algo=None, train=True, seed=0, samples=25, tol=1e-6, inputs=None, no_grad=()):
    """``inputs``: {position: array} to use instead of random values (token ids); ``no_grad``: positions whose
    gradient the layer does not give (ids)."""
    rng = np.random.default_rng(seed)
    out_shape = layer.output_shape(in_shapes)
    ctx = make_ctx(layer, in_shapes, rng, algo=algo, train=train)
    xs = [rng.standard_normal(physical(s)) for s in in_shapes]
    for i, arr in (inputs or {}).items():
        xs[i] = np.asarray(arr, dtype=np.float64)
    y = run_forward(layer, ctx, xs, out_shape)
    r = rng.standard_normal(y.shape)  # loss = sum(y * r)
    dxs = [None if i in no_grad else np.full(x.shape, np.nan) for i, x in enumerate(xs)]
    needs_y = "y" in layer.needs or "mask" in layer.needs
    ctx.grads = {k: np.full(g.shape, np.nan) for k, g in ctx.grads.items()}
    layer.backward(ctx, r.copy(), xs if "x" in layer.needs else None, y if needs_y else None, dxs)

    def loss():
        return float(np.sum(run_forward(layer, ctx, xs, out_shape) * r))

    def numeric(arr, idx, eps=1e-6):
        old = arr[idx]
        arr[idx] = old + eps
        up = loss()
        arr[idx] = old - eps
        down = loss()
        arr[idx] = old
        return (up - down) / (2 * eps)

    checked = []
    for name, target, grad in [(f"x{i}", x, dx) for i, (x, dx) in enumerate(zip(xs, dxs)) if dx is not None] + [
        (k, ctx.params[k], ctx.grads[k]) for k in ctx.grads
    ]:
        assert not np.isnan(grad).any(), f"{name}: backward left gradient entries unwritten"
        flat = rng.choice(target.size, size=min(samples, target.size), replace=False)
        for f in flat:
            idx = np.unravel_index(f, target.shape)
            want = numeric(target, idx)
            got = grad[idx]
            assert abs(got - want) <= tol * max(1.0, abs(want)), f"{layer!r} d{name}{idx}: {got} vs numeric {want}"
        checked.append(name)
    return checked
