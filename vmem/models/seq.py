"""Sequence models: a Sockeye-style NMT model (LSTM encoder and decoder with MLP attention), unrolled over
time with shared weights, and a small transformer encoder.

Inputs are token ids as floating-point values. ``nmt`` takes (N, 2T): the source sentence, then the target
shifted right (teacher forcing; token 1 begins it); it predicts the target, (N, T, vocabulary). Id 0 is
padding: attention ignores padded source positions and the loss ignores padded labels.
"""

from __future__ import annotations

from ..graph import Graph, Node
from ..nn import (
    Add,
    Concat,
    Dropout,
    Embedding,
    ExpandDims,
    LayerNorm,
    LengthMask,
    Linear,
    MatMul,
    Mul,
    ReLU,
    Reshape,
    Sigmoid,
    Softmax,
    SoftmaxCrossEntropy,
    Tanh,
)
from ..nn.base import Layer

__all__ = ["nmt", "transformer", "PAD", "BOS"]

PAD, BOS = 0, 1


class _Shared:
    """A layer applied at many places of a graph: added the first time, reused after (shared weights)."""

    def __init__(self, g: Graph, layer: Layer, name: str):
        self.g, self.layer, self.name, self.used = g, layer, name, False

    def __call__(self, *inputs: Node) -> Node:
        if self.used:
            return self.g.reuse(self.layer, *inputs)
        self.used = True
        return self.g.add(self.layer, *inputs, name=self.name)


def _steps(g: Graph, seq: Node, length: int, features: int, name: str) -> list[Node]:
    """The time steps of a (N, T, F) sequence as (N, F) nodes."""
    return [
        g.add(Reshape((features,)), piece, name=f"{name}.t{t}")
        for t, piece in enumerate(g.split(seq, length, axis=1, name=f"{name}.split"))
    ]


def _stack(g: Graph, nodes: list[Node], name: str) -> Node:
    """(N, F) nodes as one (N, T, F) sequence."""
    expanded = [g.add(ExpandDims(1), n) for n in nodes]
    return g.add(Concat(axis=1), *expanded, name=name) if len(expanded) > 1 else expanded[0]


def _lstm(
    g: Graph, seq: Node, length: int, features: int, hidden: int, name: str, state: tuple[Node, Node] | None = None
) -> tuple[list[Node], tuple[Node, Node]]:
    """One LSTM layer over (N, T, F): the input projection of every step at once (a Linear over the
    sequence), the recurrent projection shared by every step. Returns the hidden states and the last state."""
    xproj = g.add(Linear(features, 4 * hidden), seq, name=f"{name}.wx")
    wh = _Shared(g, Linear(hidden, 4 * hidden, bias=False), f"{name}.wh")
    h, c = state if state is not None else (None, None)
    outputs = []
    for t, x_t in enumerate(_steps(g, xproj, length, 4 * hidden, f"{name}.x")):
        gates = g.add(Add(), x_t, wh(h)) if h is not None else x_t
        i, f, u, o = g.split(gates, 4, axis=1)
        i, f, o = g.add(Sigmoid(), i), g.add(Sigmoid(), f), g.add(Sigmoid(), o)
        u = g.add(Tanh(), u)
        iu = g.add(Mul(), i, u)
        c = g.add(Add(), g.add(Mul(), f, c), iu) if c is not None else iu
        h = g.add(Mul(), o, g.add(Tanh(), c), name=f"{name}.h{t}")
        outputs.append(h)
    return outputs, (h, c)  # type: ignore[return-value]


def nmt(
    seq_len: int = 100,
    hidden: int = 512,
    attention: int = 512,
    embed: int | None = None,
    layers: int = 2,
    src_vocab: int = 17191,
    tgt_vocab: int = 7709,
    encoder_layers: int | None = None,
    decoder_layers: int | None = None,
    dropout: float = 0.0,
    name: str = "nmt",
) -> Graph:
    """Sockeye-style NMT (Echo's benchmark): embeddings, ``layers`` LSTM layers in the encoder and the
    decoder (each decoder layer starts from the matching encoder layer's last state), MLP attention
    (``v . tanh(K h_enc + q h_dec)``, masked at padded source positions) after the top decoder layer, and
    ``tanh(W [h; context])`` into the output projection; ``dropout`` after the embeddings and before the
    output projection."""
    for key, v in (
        ("seq_len", seq_len),
        ("hidden", hidden),
        ("attention", attention),
        ("layers", layers),
        ("src_vocab", src_vocab),
        ("tgt_vocab", tgt_vocab),
    ):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"nmt: {key}={v!r} must be a positive int")
    embed = embed or hidden
    enc_layers, dec_layers = encoder_layers or layers, decoder_layers or layers
    T = seq_len
    g = Graph(input_shape=(2 * T,), name=name)
    src, tgt = g.split(g.input, 2, axis=1, name="tokens")
    seq, feats = g.add(Embedding(src_vocab, embed), src, name="src_embed"), embed
    if dropout:
        seq = g.add(Dropout(dropout), seq)
    states = []
    for layer in range(enc_layers):
        hs, state = _lstm(g, seq, T, feats, hidden, f"enc{layer}")
        states.append(state)
        seq, feats = _stack(g, hs, f"enc{layer}.out"), hidden
    memory = seq  # (N, T, H)
    keys = g.add(Linear(hidden, attention, bias=False), memory, name="att.keys")
    seq, feats = g.add(Embedding(tgt_vocab, embed), tgt, name="tgt_embed"), embed
    if dropout:
        seq = g.add(Dropout(dropout), seq)
    for layer in range(dec_layers):
        hs, _ = _lstm(g, seq, T, feats, hidden, f"dec{layer}", states[min(layer, len(states) - 1)])
        seq, feats = _stack(g, hs, f"dec{layer}.out") if layer < dec_layers - 1 else None, hidden  # type: ignore[assignment]
    query = _Shared(g, Linear(hidden, attention, bias=False), "att.query")
    score = _Shared(g, Linear(attention, 1, bias=False), "att.v")
    mix = _Shared(g, Linear(2 * hidden, hidden), "att.out")
    outs = []
    for t, h in enumerate(hs):
        q = g.add(ExpandDims(1), query(h))
        e = g.add(Tanh(), g.add(Add(), keys, q, name=f"att.e{t}"))
        s = g.add(Reshape((T,)), score(e))
        alpha = g.add(Softmax(axis=1), g.add(LengthMask(PAD), s, src), name=f"att.alpha{t}")
        context = g.add(Reshape((hidden,)), g.add(MatMul(), g.add(ExpandDims(1), alpha), memory))
        outs.append(g.add(Tanh(), mix(g.add(Concat(axis=1), h, context))))
    outs_seq = _stack(g, outs, "att.outs")
    if dropout:
        outs_seq = g.add(Dropout(dropout), outs_seq)
    g.add(Linear(hidden, tgt_vocab), outs_seq, name="logits")
    g.loss = SoftmaxCrossEntropy(ignore=PAD)
    return g


def nmt_small(seq_len: int = 8, hidden: int = 32, vocab: int = 50, **options) -> Graph:
    """``nmt`` for the CPU: one LSTM layer each side, hidden 32, vocabulary 50, sequences of 8."""
    options.setdefault("layers", 1)
    options.setdefault("attention", hidden)
    g = nmt(seq_len=seq_len, hidden=hidden, src_vocab=vocab, tgt_vocab=vocab, name="nmt_small", **options)
    g.train_defaults = {"batch": 64, "epochs": 3, "optimizer": "adam", "lr": 0.01}  # what vmem train uses
    return g


def transformer(
    layers: int = 6,
    seq_len: int = 128,
    dim: int = 512,
    heads: int = 8,
    ffn: int = 2048,
    vocab: int = 32000,
    name: str = "transformer",
) -> Graph:
    """A transformer encoder stack (post-norm) over (N, T) token ids predicting a token per position (a
    masked-language-model head): embeddings plus a learned position table, then ``layers`` blocks of
    multi-head self-attention and a ReLU feed-forward network, each with a residual and LayerNorm."""
    for key, value in (
        ("layers", layers),
        ("seq_len", seq_len),
        ("dim", dim),
        ("heads", heads),
        ("ffn", ffn),
        ("vocab", vocab),
    ):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"transformer: {key}={value!r} must be a positive int")
    if dim % heads:
        raise ValueError(f"transformer: dim={dim} does not split into {heads} heads")
    T = seq_len
    g = Graph(input_shape=(T,), name=name)
    x = g.add(Embedding(vocab, dim), g.input, name="embed")
    pos = g.add(Embedding(T, dim), g.add(_Positions(), g.input), name="pos")
    x = g.add(Add(), x, pos)
    for b in range(layers):
        qkv = [g.add(Linear(dim, dim), x, name=f"b{b}.{w}") for w in "qkv"]
        pieces = [g.split(t, heads, axis=2) if heads > 1 else [t] for t in qkv]
        heads_out = []
        for h in range(heads):
            q, k, v = (p[h] for p in pieces)
            s = g.add(MatMul(transpose_b=True), q, k, name=f"b{b}.h{h}.scores")
            a = g.add(Softmax(axis=2), s, name=f"b{b}.h{h}.attn")
            heads_out.append(g.add(MatMul(), a, v))
        att = g.add(Concat(axis=2), *heads_out) if heads > 1 else heads_out[0]
        x = g.add(LayerNorm(dim), g.add(Add(), x, g.add(Linear(dim, dim), att, name=f"b{b}.proj")), name=f"b{b}.ln1")
        f = g.add(Linear(ffn, dim), g.add(ReLU(), g.add(Linear(dim, ffn), x, name=f"b{b}.ffn1")), name=f"b{b}.ffn2")
        x = g.add(LayerNorm(dim), g.add(Add(), x, f), name=f"b{b}.ln2")
    g.add(Linear(dim, vocab), x, name="logits")
    return g


class _Positions(Layer):
    """The position of each token (0 .. T-1), for a learned position table."""

    kind = "positions"

    def forward(self, ctx, xs, y) -> None:  # type: ignore[no-untyped-def]
        y[...] = ctx.xp.arange(y.shape[1], dtype=y.dtype)

    def backward(self, ctx, dy, xs, y, dxs) -> None:  # type: ignore[no-untyped-def]
        if dxs[0] is not None:
            dxs[0].fill(0)
