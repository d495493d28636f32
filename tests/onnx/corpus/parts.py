"""Which part of a PyTorch parameter an initializer holds, where it is not the whole parameter (no PyTorch needed).

Rows: an exporter that folds constants cuts a packed projection (``nn.MultiheadAttention``'s ``in_proj_weight``
for a cross-attention) into the rows each product reads, ``name[a:b]``, as ``vmem.onnx.load`` names such a
weight's source (``net.sources``), transposed or not.

One row everywhere: the dynamo exporter folds a table read at one fixed row (BERT's token types) into a
constant repeating that row at every position and sample, ``name[r:r+1]`` of the table.

Recurrent layers: ONNX orders a recurrent layer's gates its own way (LSTM ``iofc``, GRU ``zrh``) and joins the input and recurrent
biases into one ``B``; PyTorch (and vmem, whose importer undoes ONNX's order) keeps ``ifgo`` / ``rzn`` and two
biases. An initializer W or R holds a parameter per direction with its gate blocks reordered; B holds two per
direction, named ``B[k, 0:n]`` and ``B[k, n:2n]`` as ``vmem.onnx.load`` names the parts it takes them from
(``net.sources``).
"""

from __future__ import annotations

import numpy as np

#: per op: its gates, and for each of PyTorch's gates in order, which of ONNX's blocks it is
ORDER = {"LSTM": (4, (0, 2, 3, 1)), "GRU": (3, (1, 0, 2))}


def torch_order(value: np.ndarray, op: str) -> np.ndarray:
    """ONNX's gate blocks (along axis 0) in PyTorch's order."""
    gates, order = ORDER[op]
    h = value.shape[0] // gates
    return np.concatenate([value[k * h : (k + 1) * h] for k in order], axis=0)


def parts(node, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What each of a recurrent node's initializers holds for each direction, in PyTorch's order: its source
    name as ``vmem.onnx.load`` records it (``W[k]``, ``R[k]``, ``B[k, 0:n]``, ``B[k, n:2n]``) -> the values."""
    out = {}
    w, r = values[node.input[1]], values[node.input[2]]
    for k in range(len(w)):
        out[f"{node.input[1]}[{k}]"] = torch_order(w[k], node.op_type)
        out[f"{node.input[2]}[{k}]"] = torch_order(r[k], node.op_type)
        if len(node.input) > 3 and node.input[3]:
            b = values[node.input[3]][k]
            n = b.size // 2
            out[f"{node.input[3]}[{k}, 0:{n}]"] = torch_order(b[:n], node.op_type)
            out[f"{node.input[3]}[{k}, {n}:{2 * n}]"] = torch_order(b[n:], node.op_type)
    return out


def rows(value: np.ndarray, initial: dict[str, np.ndarray]) -> str | None:
    """``"name[a:b]"`` where ``value`` (or its transpose) is rows ``a:b`` of a parameter of ``initial`` and not the
    whole of one, else None."""
    for candidate in (value, value.T) if value.ndim == 2 else (value,):
        for key, param in initial.items():
            n = len(candidate) if candidate.ndim else 0
            if not n or param.ndim != candidate.ndim or param.shape[1:] != candidate.shape[1:] or n >= len(param):
                continue
            for a in range(len(param) - n + 1):
                if np.array_equal(param[a : a + n], candidate):
                    return f"{key}[{a}:{a + n}]"
    return None


def repeated_row(value: np.ndarray, initial: dict[str, np.ndarray]) -> str | None:
    """``"name[r:r+1]"`` where every row of ``value`` (all its axes but the last) is row ``r`` of a table of
    ``initial``: the dynamo exporter folds a table read at one fixed row everywhere (BERT's token types at
    their default) into such a constant, one row per position and sample; else None."""
    flat = value.reshape(-1, value.shape[-1]) if value.ndim >= 2 else None
    if flat is None or len(flat) < 2 or not (flat == flat[:1]).all():
        return None
    for key, param in initial.items():
        if param.ndim == 2 and param.shape[1] == flat.shape[1]:
            for r in range(len(param)):
                if np.array_equal(param[r], flat[0]):
                    return f"{key}[{r}:{r + 1}]"
    return None


def sources(graph, values: dict[str, np.ndarray], initial: dict[str, np.ndarray]) -> dict[str, str]:
    """Each recurrent node's initializers (and B's halves) -> the parameter of ``initial`` it holds, by value."""
    out = {}
    for node in graph.node:
        if node.op_type not in ORDER:
            continue
        for name, value in parts(node, values).items():
            key = next((k for k, p in initial.items() if p.shape == value.shape and np.array_equal(p, value)), None)
            if key is not None:
                out[name] = key
    return out
