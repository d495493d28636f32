"""The ONNX importer's converters for recurrent layers (``LSTM``, ``GRU``), unrolled over time into vmem's own layers
as ``vmem.models``' sequence models are: the input projection of every step at once (a Linear over the
sequence), the recurrent projection one Linear applied again at every step (``Graph.reuse``: its gradient summed
over the steps), the gates split, squashed and combined by vmem's element-wise layers; Echo's recomputation plans
it as it plans vmem's own NMT.

vmem keeps the gates in the order PyTorch and cuDNN keep them (LSTM: input, forget, cell, output; GRU: reset,
update, new), so an imported weight is the module's own: ONNX's order (LSTM ``iofc``, GRU ``zrh``) is undone at
import. ONNX's one bias of ``8H`` (``6H``) is the input projection's and the recurrent projection's, trained
apart as PyTorch trains ``bias_ih`` and ``bias_hh``; ``net.sources`` names them ``B[0]`` and ``B[1]`` (the
initializer ``B``'s first and second half).

Taken: one direction, forward or reverse (``bidirectional`` is refused: not yet), the default activations, no
clip, ``input_forget=0``, the sequence first (``layout=0``, the batch moved behind it, as PyTorch exports a
``batch_first`` layer) or the batch first (``layout=1``), no initial state or one of zeros, no sequence lengths
(or all the sequence's length), peepholes or none (each a trained weight per feature, ``P[k]`` in ONNX's
order i, o, f); a GRU with ``linear_before_reset`` either way. Each refusal names what it met.
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


def _check_attrs(op: str, attrs: Attrs) -> tuple[int, bool, int]:
    """(hidden size, reverse, layout), or refused naming what vmem does not take."""
    hidden = int(attrs.get("hidden_size", 0))
    if hidden <= 0:
        raise _Refuse("names no hidden_size")
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in ("forward", "reverse"):
        raise _Refuse(f"direction={direction!r}: vmem imports one direction (forward or reverse), not yet both")
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in attrs.get("activations", [])]
    if acts and [a.lower() for a in acts] != _DEFAULT_ACTIVATIONS[op]:
        raise _Refuse(f"activations={acts}: vmem imports the default ones ({', '.join(_DEFAULT_ACTIVATIONS[op])})")
    if attrs.get("clip") is not None:
        raise _Refuse("clip: vmem does not clip the gates' inputs")
    if int(attrs.get("input_forget", 0)):
        raise _Refuse("input_forget=1 (coupled input and forget gates)")
    return hidden, direction == "reverse", int(attrs.get("layout", 0))


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

    def outputs(self, hs: list[_Tensor], last: list[_Tensor]) -> list[_Tensor]:
        """Y (every step's h, in the sequence's order) and the last states, laid out as the model's."""
        b, layout = self.b, self.layout
        if self.lead:  # Y (T, 1, N, H) or (N, T, 1, H) as one sample; Y_h (1, N, H) or (N, 1, H), lifted
            n, h = self.rows[0], hs[0].shape[-1]
            each = (1, 1, n, h) if layout == 0 else (n, 1, 1, h)
            stacked = [b.add(nn.Reshape(each), [s]) for s in hs]
            y = b.add(nn.Concat(axis=1 + layout), stacked) if len(hs) > 1 else stacked[0]
            states = [b.add(nn.Reshape((1, 1, n, h) if layout == 0 else (1, n, 1, h)), [s], lifted=True) for s in last]
            return [y, *states]
        stacked = [b.add(nn.ExpandDims(1), [s]) for s in hs]
        y = b.add(nn.Concat(axis=1), stacked) if len(hs) > 1 else stacked[0]  # (N, T, H)
        y_out = _views.viewed(y, ((1,), (), (0,), (2,)) if layout == 0 else ((0,), (1,), (), (2,)))
        return [y_out, *(_views.viewed(s, ((), (0,), (1,)) if layout == 0 else ((0,), (), (1,))) for s in last)]


def _zero_state(b: _Builder, ins: Ins, i: int, what: str) -> None:
    """Input ``i`` (an initial state) absent or zeros; refused otherwise."""
    value = ins[i] if i < len(ins) else None
    if value is None:
        return
    if isinstance(value, np.ndarray) and not value.any():
        return
    raise _Refuse(f"its {what} (input {i}) is not zeros: vmem starts a recurrence from zeros")


def _recurrent(b: _Builder, ins: Ins, attrs: Attrs, op: str) -> Outs:
    hidden, reverse, layout = _check_attrs(op, attrs)
    lay = _Layout(b, ins, layout)
    steps, features = lay.steps, lay.features
    gates, _ = _GATES[op]
    w = b.const(ins, 1, "weights W")
    r = b.const(ins, 2, "recurrence weights R")
    assert w is not None and r is not None
    if w.shape != (1, gates * hidden, features) or r.shape != (1, gates * hidden, hidden):
        raise _Refuse(f"W {w.shape} and R {r.shape} do not fit one direction of {gates} gates of {hidden}")
    bias = b.const(ins, 3, "bias B", optional=True)
    bias = np.zeros((1, 2 * gates * hidden), np.float32) if bias is None else bias
    lengths = ins[4] if len(ins) > 4 else None
    if lengths is not None and not (isinstance(lengths, np.ndarray) and (lengths == steps).all()):
        raise _Refuse("sequence_lens other than the whole sequence: vmem runs every step of every sample")
    _zero_state(b, ins, 5, "initial_h")
    peep = None
    if op == "LSTM":
        _zero_state(b, ins, 6, "initial_c")
        peep = b.const(ins, 7, "peepholes P", optional=True)
        if peep is not None and peep.shape != (1, 3 * hidden):
            raise _Refuse(f"peepholes P {peep.shape}: one direction's three of {hidden}")
    names = b.input_names
    n_in = gates * hidden
    # the input projection of every step at once, its bias B's first half; the recurrent one, B's second half
    base = b._name()  # the module's name (PyTorch's scope): its projections are base.ih and base.hh
    w_ih: dict[str, np.ndarray | None] = {
        "weight": _reordered(w[0], op, hidden),
        "bias": _reordered(bias[0, :n_in], op, hidden),
    }
    wx = b.add(nn.Linear(features, n_in), [lay.x], w_ih, name=_unique(f"{base}.ih", "ih", b.graph))
    b.sources[f"{wx.node.name}.weight"] = b.origin.get(names[1], names[1])
    if len(names) > 3 and names[3]:
        b.sources[f"{wx.node.name}.bias"] = f"{b.origin.get(names[3], names[3])}[0]"
    r_params: dict[str, np.ndarray | None] = {
        "weight": _reordered(r[0], op, hidden),
        "bias": _reordered(bias[0, n_in:], op, hidden),
    }
    order = list(range(steps - 1, -1, -1) if reverse else range(steps))
    xs = [lay.step(wx, t, n_in) for t in range(steps)]
    zeros = b.add(nn.Split(gates, 0, axis=lay.axis), [b.add(nn.Select("isnan", 0.0, 0.0, 0.0), [xs[order[0]]])])
    bias_source = f"{b.origin.get(names[3], names[3])}[1]" if len(names) > 3 and names[3] else None
    source = {"weight": b.origin.get(names[2], names[2]), "bias": bias_source}
    recurrence = _Shared(b, nn.Linear(hidden, n_in), r_params, f"{base}.hh", source)
    peepholes = None
    if peep is not None:  # ONNX's i, o, f, each a trained per-feature weight on the cell (shared by the steps)
        p_source = b.origin.get(names[7], names[7])
        peepholes = {
            gate: _Shared(
                b,
                nn.ConstantOp("mul", peep[0, k * hidden : (k + 1) * hidden], trainable=True),
                {},
                f"{base}.p_{gate}",
                {"value": f"{p_source}[{k}]"},
            )
            for k, gate in enumerate("iof")
        }
    h, c = zeros, zeros
    hs: dict[int, _Tensor] = {}
    for t in order:
        if op == "LSTM":
            h, c = _lstm_step(b, lay.axis, xs[t], recurrence(h), c, peepholes)
        else:
            h = _gru_step(b, lay.axis, xs[t], recurrence, h, bool(int(attrs.get("linear_before_reset", 0))))
        hs[t] = h
    return lay.outputs([hs[t] for t in range(steps)], [h, c] if op == "LSTM" else [h])


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
