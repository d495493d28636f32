"""The ONNX importer's converters for recurrent layers (``LSTM``, ``GRU``), unrolled over time into vmem's own layers
as ``vmem.models``' sequence models are: the input projection of every step at once (a Linear over the
sequence), the recurrent projection one Linear applied again at every step (``Graph.reuse``: its gradient summed
over the steps), the gates split, squashed and combined by vmem's element-wise layers; Echo's recomputation plans
it as it plans vmem's own NMT.

vmem keeps the gates in the order PyTorch and cuDNN keep them (LSTM: input, forget, cell, output; GRU: reset,
update, new), so an imported weight is the module's own: ONNX's order (LSTM ``iofc``, GRU ``zrh``) is undone at
import. ONNX's one bias of ``8H`` (``6H``) is the input projection's and the recurrent projection's, trained
apart as PyTorch trains ``bias_ih`` and ``bias_hh``. ``net.sources`` names each parameter's source as the
initializer indexed as NumPy would: direction k's ``W[k]`` and ``R[k]`` (gates reordered), ``B[k, 0:n]`` and
``B[k, n:2n]``, ``P[k, a:b]``.

Taken: forward, reverse and bidirectional layers (the second direction's projections named ``*_reverse``, as
PyTorch names them), the default activations, no
clip, ``input_forget=0``, the sequence first (``layout=0``, the batch moved behind it, as PyTorch exports a
``batch_first`` layer) or the batch first (``layout=1``), no initial state or one of zeros, sequence lengths
given as an input (each sample's state stops at its last step, its outputs past it zeros: ``nn.StepMask``) or
none (or all the sequence's length), peepholes or none (each a trained weight per feature, in ONNX's order
i, o, f); a GRU with ``linear_before_reset`` either way. Each refusal names what it met.
"""

from __future__ import annotations


import numpy as np

from .. import nn
from . import _views
from ._builder import Attrs, Ins, Outs, _Builder, _converts, _Refuse, _Tensor, _unique

#: Per op: its gates, and for each of vmem's gates in order, which of ONNX's blocks it is.
_GATES = {"LSTM": (4, (0, 2, 3, 1)), "GRU": (3, (1, 0, 2))}
_DEFAULT_ACTIVATIONS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}


@_converts("LSTM", 7, 14, 22)
def _lstm(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    return _recurrent(b, ins, attrs, "LSTM")


@_converts("GRU", 7, 14, 22)
def _gru(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    return _recurrent(b, ins, attrs, "GRU")


def _reordered(w: np.ndarray, op: str, hidden: int) -> np.ndarray:
    """ONNX's gate blocks (along axis 0) in vmem's order."""
    _, order = _GATES[op]
    return np.concatenate([w[k * hidden : (k + 1) * hidden] for k in order], axis=0)


def _check_attrs(op: str, attrs: Attrs) -> tuple[int, list[bool], int]:
    """(hidden size, each direction's ``reverse``, layout), or refused naming what vmem does not take."""
    hidden = int(attrs.get("hidden_size", 0))
    if hidden <= 0:
        raise _Refuse("names no hidden_size")
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if reverse is None:
        raise _Refuse(f"direction={direction!r}: one of forward, reverse and bidirectional")
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in attrs.get("activations", [])]
    if acts and [a.lower() for a in acts] != _DEFAULT_ACTIVATIONS[op]:
        raise _Refuse(f"activations={acts}: vmem imports the default ones ({', '.join(_DEFAULT_ACTIVATIONS[op])})")
    if attrs.get("clip") is not None:
        raise _Refuse("clip: vmem does not clip the gates' inputs")
    if int(attrs.get("input_forget", 0)):
        raise _Refuse("input_forget=1 (coupled input and forget gates)")
    return hidden, reverse, int(attrs.get("layout", 0))


class _Layout:
    """Where a recurrence's axes are in vmem: X as a vmem tensor ``x`` whose axis ``time`` is the sequence;
    each step's values are vmem tensors of ``rows + (features,)`` after vmem's batch axis (``rows``: the
    model's batch axis where the model has none of its own, ``batch=False``); the outputs Y, Y_h and Y_c
    made from the steps as the model lays them out."""

    def __init__(self, b: _Builder, ins: Ins, layout: int):
        x = b.tensor(ins, 0, "input X", view=True)
        if len(x.dims) != 3:
            raise _Refuse(f"its input X has shape {x.dims}: a recurrent layer reads (sequence, batch, features)")
        self.b, self.layout, self.lead = b, layout, x.lead
        self.rows: tuple[int, ...] = ()
        if x.lead:  # no batch axis: X is one sample, held lifted (1, 1, d0, d1, F); the model's batch is a row
            if x.view is not None or not x.lifted:
                raise _Refuse(f"its input X {x.dims} is not a tensor vmem holds whole")
            self.x, self.time = _Tensor(x.node, x.shape), 2 + layout
            self.steps, self.rows = x.dims[layout], (x.dims[1 - layout],)
        else:
            raw, groups = _views.groups_of(b, x)
            want = ((1,), (0,), (2,)) if layout == 0 else ((0,), (1,), (2,))
            if len(raw.shape) != 3 or groups != want:
                held = _views.where(x) if x.view is not None else "the batch first"
                raise _Refuse(
                    f"its input X (layout={layout}) holds {held}: vmem imports the sequence first with the batch "
                    "behind it (layout=0), the batch first (layout=1), or a model without a batch axis "
                    "(vmem.onnx.load(..., batch=False))"
                )
            self.x, self.time, self.steps = raw, 1, raw.shape[1]
        self.features = x.dims[2]

    @property
    def axis(self) -> int:
        """The features' axis of a step's vmem tensor (gates are split along it)."""
        return 1 + len(self.rows)

    def step(self, projected: _Tensor, t: int, n: int) -> _Tensor:
        """Step ``t`` of the projected sequence (``n`` values a step and row)."""
        piece = self.b.add(nn.Split(self.steps, t, axis=self.time), [projected])
        return self.b.add(nn.Reshape(self.rows + (n,)), [piece])

    def outputs(self, hs: list[list[_Tensor]], last: list[list[_Tensor]]) -> list[_Tensor]:
        """Y (each direction's h at every step, in the sequence's order) and the last states (h, and c for an
        LSTM: each a list by direction), laid out as the model's: Y (T, D, N, H) or (N, T, D, H), a state
        (D, N, H) or (N, D, H)."""
        b, layout, d = self.b, self.layout, len(hs)
        steps = len(hs[0])
        if self.lead:  # one sample, the model's batch a row: vmem (1, *model dims), a state lifted
            n, h = self.rows[0], hs[0][0].shape[-1]
            each = (1, 1, n, h) if layout == 0 else (n, 1, 1, h)
            per_t = [
                _joined(b, [b.add(nn.Reshape(each), [hs[k][t]]) for k in range(d)], 2 + layout) for t in range(steps)
            ]
            y = _joined(b, per_t, 1 + layout)
            one = (1, 1, n, h) if layout == 0 else (1, n, 1, h)
            states = [
                _joined(b, [b.add(nn.Reshape(one), [s[k]], lifted=True) for k in range(d)], 2 + layout) for s in last
            ]
            return [y, *states]
        if d == 1:  # Y (N, T, H) seen through a view without the directions' axis
            y = _joined(b, [b.add(nn.ExpandDims(1), [s]) for s in hs[0]], 1)  # (N, T, H)
            y_out = _views.viewed(y, ((1,), (), (0,), (2,)) if layout == 0 else ((0,), (1,), (), (2,)))
            view = ((), (0,), (1,)) if layout == 0 else ((0,), (), (1,))
            return [y_out, *(_views.viewed(s[0], view) for s in last)]
        h = hs[0][0].shape[-1]  # Y held (N, 1, T, D, H) (vmem stores 4-D tensors as images: lifted)
        per_t = [
            _joined(b, [b.add(nn.Reshape((1, 1, 1, h)), [hs[k][t]], lifted=True) for k in range(d)], 3)
            for t in range(steps)
        ]
        y = _joined(b, per_t, 2)
        y_out = _views.viewed(y, ((2,), (3,), (0,), (4,)) if layout == 0 else ((0,), (2,), (3,), (4,)))
        states = [_joined(b, [b.add(nn.ExpandDims(1), [s[k]]) for k in range(d)], 1) for s in last]  # (N, D, H)
        return [y_out, *(_views.viewed(s, ((1,), (0,), (2,)) if layout == 0 else ((0,), (1,), (2,))) for s in states)]


def _joined(b: _Builder, parts: list[_Tensor], axis: int) -> _Tensor:
    """``parts`` concatenated along ``axis`` (one part as it is), lifted where they are."""
    if len(parts) == 1:
        return parts[0]
    return b.add(nn.Concat(axis=axis), parts, lifted=parts[0].lifted)


def _zero_state(b: _Builder, ins: Ins, i: int, what: str) -> None:
    """Input ``i`` (an initial state) absent or zeros; refused otherwise."""
    value = ins[i] if i < len(ins) else None
    if value is None:
        return
    if isinstance(value, np.ndarray) and not value.any():
        return
    raise _Refuse(f"its {what} (input {i}) is not zeros: vmem starts a recurrence from zeros")


def _recurrent(b: _Builder, ins: Ins, attrs: Attrs, op: str) -> Outs:
    hidden, directions, layout = _check_attrs(op, attrs)
    lay = _Layout(b, ins, layout)
    steps, features, d = lay.steps, lay.features, len(directions)
    gates, _ = _GATES[op]
    w = b.const(ins, 1, "weights W")
    r = b.const(ins, 2, "recurrence weights R")
    assert w is not None and r is not None
    if w.shape != (d, gates * hidden, features) or r.shape != (d, gates * hidden, hidden):
        raise _Refuse(f"W {w.shape} and R {r.shape} do not fit {d} direction(s) of {gates} gates of {hidden}")
    bias = b.const(ins, 3, "bias B", optional=True)
    bias = np.zeros((d, 2 * gates * hidden), np.float32) if bias is None else bias
    lengths = ins[4] if len(ins) > 4 else None
    if isinstance(lengths, np.ndarray):  # fixed in the model: the whole sequence (no masking), or refused
        if not (lengths == steps).all():
            raise _Refuse(
                "sequence_lens fixed in the model at other lengths than the sequence's (per sample of the "
                "example batch): give them as an input of the model"
            )
        lengths = None
    lens = b.tensor(ins, 4, "sequence_lens") if lengths is not None else None
    if lens is not None and tuple(lens.dims) != (lay.x.dims[0],):
        raise _Refuse(f"sequence_lens of shape {tuple(lens.dims)}: one length per sample of the batch")
    _zero_state(b, ins, 5, "initial_h")
    peep = None
    if op == "LSTM":
        _zero_state(b, ins, 6, "initial_c")
        peep = b.const(ins, 7, "peepholes P", optional=True)
        if peep is not None and peep.shape != (d, 3 * hidden):
            raise _Refuse(f"peepholes P {peep.shape}: {d} direction(s)' three of {hidden}")
    names = [b.origin.get(n, n) if n else "" for n in b.input_names] + [""] * 8
    base = b._name()  # the module's name (PyTorch's scope): its projections are base.ih and base.hh
    hs, hn, cn = [], [], []
    for k, reverse in enumerate(directions):
        suffix = "_reverse" if reverse and d > 1 else ""  # PyTorch's names for a bidirectional layer's second
        h, c, ys = _direction(b, lay, op, attrs, k, reverse, (w, r, bias, peep), names, f"{base}", suffix, hidden, lens)
        hs.append(ys)
        hn.append(h)
        cn.append(c)
    return lay.outputs(hs, [hn, cn] if op == "LSTM" else [hn])


def _direction(
    b: _Builder,
    lay: _Layout,
    op: str,
    attrs: Attrs,
    k: int,
    reverse: bool,
    weights: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None],
    names: list[str],
    base: str,
    suffix: str,
    hidden: int,
    lens: _Tensor | None = None,
) -> tuple[_Tensor, _Tensor, list[_Tensor]]:
    """Direction ``k`` of the layer unrolled: its last h and c and its h at every step (in the sequence's
    order). Its parameters' sources: ``W[k]``, ``R[k]``, ``B[k, 0:n]`` (the input projection's bias) and
    ``B[k, n:2n]`` (the recurrent one's), ``P[k, a:b]``. With ``lens`` (the samples' lengths), a sample's
    state stops at its last step and its outputs past it are zeros (:class:`vmem.nn.StepMask`; the reverse
    direction starts at each sample's last step)."""
    w, r, bias, peep = weights
    gates, _ = _GATES[op]
    n_in, steps = gates * hidden, lay.steps
    w_ih: dict[str, np.ndarray | None] = {
        "weight": _reordered(w[k], op, hidden),
        "bias": _reordered(bias[k, :n_in], op, hidden),
    }
    wx = b.add(nn.Linear(lay.features, n_in), [lay.x], w_ih, name=_unique(f"{base}.ih{suffix}", "ih", b.graph))
    b.sources[f"{wx.node.name}.weight"] = f"{names[1]}[{k}]"
    if names[3]:
        b.sources[f"{wx.node.name}.bias"] = f"{names[3]}[{k}, 0:{n_in}]"
    r_params: dict[str, np.ndarray | None] = {
        "weight": _reordered(r[k], op, hidden),
        "bias": _reordered(bias[k, n_in:], op, hidden),
    }
    order = list(range(steps - 1, -1, -1) if reverse else range(steps))
    xs = [lay.step(wx, t, n_in) for t in range(steps)]
    zeros = b.add(nn.Split(gates, 0, axis=lay.axis), [b.add(nn.Select("isnan", 0.0, 0.0, 0.0), [xs[order[0]]])])
    source = {"weight": f"{names[2]}[{k}]", "bias": f"{names[3]}[{k}, {n_in}:{2 * n_in}]" if names[3] else None}
    recurrence = _Shared(b, nn.Linear(hidden, n_in), r_params, f"{base}.hh{suffix}", source)
    peepholes = None
    if peep is not None:  # ONNX's i, o, f, each a trained per-feature weight on the cell (shared by the steps)
        peepholes = {
            gate: _Shared(
                b,
                nn.ConstantOp("mul", peep[k, j * hidden : (j + 1) * hidden], trainable=True),
                {},
                f"{base}.p_{gate}{suffix}",
                {"value": f"{names[7]}[{k}, {j * hidden}:{(j + 1) * hidden}]"},
            )
            for j, gate in enumerate("iof")
        }
    h, c = zeros, zeros
    hs: dict[int, _Tensor] = {}
    for t in order:
        if op == "LSTM":
            h_new, c_new = _lstm_step(b, lay.axis, xs[t], recurrence(h), c, peepholes)
        else:
            h_new = _gru_step(b, lay.axis, xs[t], recurrence, h, bool(int(attrs.get("linear_before_reset", 0))))
            c_new = c
        if lens is None:
            h, c, hs[t] = h_new, c_new, h_new
            continue
        hs[t] = b.add(nn.StepMask(t), [h_new, zeros, lens])  # zeros past the sample's last step
        h = b.add(nn.StepMask(t), [h_new, h, lens])  # the state as it was, past it
        c = b.add(nn.StepMask(t), [c_new, c, lens]) if op == "LSTM" else c
    return h, c, [hs[t] for t in range(steps)]


class _Shared:
    """A layer every step applies: added at its first use (holding ``params``, its sources named in
    ``net.sources``), applied again at every later one (``Graph.reuse``: its gradient summed over them)."""

    def __init__(self, b: _Builder, layer: nn.Layer, params: dict[str, np.ndarray | None], name: str, sources: dict):
        self.b, self.layer, self.params, self.name, self.sources = b, layer, params, name, sources
        self.used: _Tensor | None = None

    def __call__(self, x: _Tensor) -> _Tensor:
        b = self.b
        if self.used is not None:
            return _Tensor(b.graph.reuse(self.layer, x.node), self.layer.output_shape([x.shape]))
        out = self.used = b.add(self.layer, [x], self.params, name=_unique(self.name, "step", b.graph))
        for key, source in self.sources.items():
            if source is not None:
                b.sources[f"{out.node.name}.{key}"] = source
        return out


def _pieces(b: _Builder, v: _Tensor, gates: int, axis: int) -> list[_Tensor]:
    return [b.add(nn.Split(gates, k, axis=axis), [v]) for k in range(gates)]


def _lstm_step(
    b: _Builder, axis: int, xt: _Tensor, rh: _Tensor, c: _Tensor, peep: dict[str, _Shared] | None
) -> tuple[_Tensor, _Tensor]:
    """One LSTM step: ``i, f, o = sigmoid``, ``u = tanh`` of the summed projections (vmem's gate order
    i, f, u, o), with the peepholes' ``p * c`` where the model has them (i and f on the last cell, o on the
    new one); ``c = f * c + i * u``; ``h = o * tanh(c)``."""
    i, f, u, o = _pieces(b, b.add(nn.Add(), [xt, rh]), 4, axis)
    if peep is not None:
        i, f = (b.add(nn.Add(), [g, peep[k](c)]) for g, k in ((i, "i"), (f, "f")))
    i, f = (b.add(nn.Sigmoid(), [g]) for g in (i, f))
    u = b.add(nn.Tanh(), [u])
    c = b.add(nn.Add(), [b.add(nn.Mul(), [f, c]), b.add(nn.Mul(), [i, u])])
    if peep is not None:
        o = b.add(nn.Add(), [o, peep["o"](c)])
    o = b.add(nn.Sigmoid(), [o])
    return b.add(nn.Mul(), [o, b.add(nn.Tanh(), [c])]), c


def _gru_step(b: _Builder, axis: int, xt: _Tensor, recurrence: _Shared, h: _Tensor, before_reset: bool) -> _Tensor:
    """One GRU step: ``r, z = sigmoid`` of the summed projections; the new gate
    ``n = tanh(x_n + r * (h R_n + b_n))`` with ``linear_before_reset=1`` (PyTorch's), else
    ``n = tanh(x_n + (r * h) R_n + b_n)`` (the recurrent projection applied to ``r * h`` too, its other gates'
    part unused); ``h' = n + z * (h - n)``."""
    xr, xz, xn = _pieces(b, xt, 3, axis)
    hr, hz, hn = _pieces(b, recurrence(h), 3, axis)
    r = b.add(nn.Sigmoid(), [b.add(nn.Add(), [xr, hr])])
    z = b.add(nn.Sigmoid(), [b.add(nn.Add(), [xz, hz])])
    if before_reset:
        reset = b.add(nn.Mul(), [r, hn])
    else:
        reset = _pieces(b, recurrence(b.add(nn.Mul(), [r, h])), 3, axis)[2]
    n = b.add(nn.Tanh(), [b.add(nn.Add(), [xn, reset])])
    return b.add(nn.Add(), [n, b.add(nn.Mul(), [z, b.add(nn.Sub(), [h, n])])])
