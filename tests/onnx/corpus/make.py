"""Regenerate the ONNX corpus the tests read (``tests/onnx/corpus/*.onnx`` and ``*.npz``): small models made
with PyTorch the way its users write them, exported by ``torch.onnx.export``, so that the suite checks the
importer against PyTorch's exports without PyTorch installed.

Needs torch (2.13 here), onnx, onnxscript (the dynamo exporter's) and transformers (5 here, for the
``hf_*`` models); run from the repository root::

    python tests/onnx/corpus/make.py            # every model: at opsets 14 and 17, and with the defaults
    python tests/onnx/corpus/make.py --list     # their names

(``make_vision.py`` beside it makes the vision corpus, networks of timm's families.)

Each model ``NAME`` writes ``NAME_opsetK.onnx`` (an inference export by the TorchScript exporter,
``dynamo=False``, the batch axis symbolic: ``N``) at each opset, ``NAME_dynamo.onnx`` and its
``NAME_dynamo.onnx.data`` (``torch.onnx.export(model, xs, path)`` with PyTorch's defaults: the dynamo
exporter, its opset, the batch fixed at the example's, 3), ``NAME_static17.onnx`` (``dynamo=False`` at
opset 17 with no dynamic axes: the batch fixed at 3 too) and ``NAME.npz``: the inputs of one batch (``x0``, ``x1``, ...), the model's output on them in float64 (``out``),
class labels (``labels``), and PyTorch's own step on that batch in float64: the loss of one SGD step
(learning rate 0.05, momentum 0.9; ``loss``) and every parameter after it (``param:<name>``, by the names
PyTorch keeps them), and per opset ``sources:K`` (``sources:dynamo``): JSON, each initializer of the export -> the
parameter it holds (found by value: a MatMul's weight is stored transposed, under a name of the exporter's);
``b8:...``: a batch of 8 and PyTorch's step on it, the same way (what the exports at a fixed batch train
at). Dropout is off everywhere (the two sides would draw other masks).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import parts
import torch
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
OPSETS = (14, 17)
VOCAB, LENGTH, HIDDEN, HEADS, FF, CLASSES = 20, 6, 16, 2, 32, 3


class Encoder(nn.Module):
    """An embedding, ``nn.TransformerEncoder`` of two ``nn.TransformerEncoderLayer``, a mean over the
    sequence and a classifier head (the issue's own model)."""

    def __init__(self, batch_first: bool, norm_first: bool, activation: str):
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        layer = nn.TransformerEncoderLayer(
            HIDDEN, HEADS, FF, dropout=0.0, activation=activation, batch_first=batch_first, norm_first=norm_first
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.encoder(h)
        if not self.batch_first:
            h = h.transpose(0, 1)
        return self.head(h.mean(1))


class Attention(nn.Module):
    """``nn.MultiheadAttention`` (packed in-projection) over a sequence of features, with a key padding mask
    and a causal attention mask; ``need_weights`` on (the heads' average weights added to the output)."""

    def __init__(self, need_weights: bool):
        super().__init__()
        self.need_weights = need_weights
        self.attn = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)  # True: not attended
        y, w = self.attn(x, x, x, key_padding_mask=pad > 0.5, attn_mask=causal, need_weights=self.need_weights)
        if w is not None:
            y = y + w.sum(-1, keepdim=True)
        return self.head(y[:, 0])


class Decoder(nn.Module):
    """``nn.TransformerDecoderLayer`` over a target sequence and a memory (both features), batch first."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(HIDDEN, HEADS, FF, dropout=0.0, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, target: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(target, memory).mean(1))


class Sdpa(nn.Module):
    """``F.scaled_dot_product_attention`` over projected heads (N, heads, T, d), causal."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, HEADS, HIDDEN // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(y.transpose(1, 2).reshape(n, t, HIDDEN).mean(1))


class Recurrent(nn.Module):
    """``nn.LSTM`` or ``nn.GRU`` (one layer, batch first) over embedded tokens; the last step classified."""

    def __init__(self, kind: str):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(HIDDEN, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(self.embed(ids))
        return self.head(y[:, -1])


class TiedLM(nn.Module):
    """A language model whose head is its embedding (``head.weight = embed.weight``, as GPT-2's and T5's):
    an embedding, one ``nn.TransformerEncoderLayer``, a layer norm, and the last position's logits over the
    vocabulary through the tied head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.block = nn.TransformerEncoderLayer(HIDDEN, HEADS, FF, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.block(self.embed(ids)))[:, -1])


class Bert(nn.Module):
    """BERT as common libraries write it: word, position and token-type embeddings, a layer norm, two
    encoder layers (separate query/key/value projections, an additive padding mask, GELU), and a pooler
    (tanh of a linear layer on the first token) under a classifier."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(VOCAB, HIDDEN)
        self.positions = nn.Embedding(LENGTH, HIDDEN)
        self.types = nn.Embedding(2, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.layers = nn.ModuleList(_BertLayer() for _ in range(2))
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, CLASSES)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
        h = self.norm(self.words(ids) + self.positions(positions) + self.types(types))
        extended = (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in self.layers:
            h = layer(h, extended)
        return self.classifier(torch.tanh(self.pooler(h[:, 0])))


class _BertLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.output = nn.Linear(HIDDEN, HIDDEN)
        self.norm1 = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.intermediate = nn.Linear(HIDDEN, FF)
        self.out = nn.Linear(FF, HIDDEN)
        self.norm2 = nn.LayerNorm(HIDDEN, eps=1e-12)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        return x.view(n, t, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.query(h)), self._heads(self.key(h)), self._heads(self.value(h))
        scores = q @ k.transpose(-1, -2) / (HIDDEN // HEADS) ** 0.5 + mask
        context = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(h.shape)
        h = self.norm1(h + self.output(context))
        return self.norm2(h + self.out(F.gelu(self.intermediate(h))))


def _ids(n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, LENGTH), generator=generator)


def _features(n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(n, LENGTH, HIDDEN, generator=generator)


def _padding(n: int) -> torch.Tensor:
    pad = torch.zeros(n, LENGTH)
    pad[1, LENGTH - 2 :] = 1.0  # the second sequence's last two positions are padding
    return pad


def models() -> dict[str, tuple[Callable[[], nn.Module], Callable[[int, torch.Generator], tuple]]]:
    """Every model of the corpus: (its constructor, its batch of ``n``)."""
    out: dict[str, tuple[Callable[[], nn.Module], Callable[[int, torch.Generator], tuple]]] = {}
    for batch_first in (True, False):
        for norm_first in (False, True):
            for activation in ("relu", "gelu"):
                if not batch_first and (norm_first or activation == "gelu"):
                    continue  # batch_first=False once, with PyTorch's defaults
                name = f"encoder_{'bf' if batch_first else 'tf'}_{'pre' if norm_first else 'post'}_{activation}"
                out[name] = (
                    lambda b=batch_first, f=norm_first, a=activation: Encoder(b, f, a),
                    lambda n, g: (_ids(n, g),),
                )
    out["mha"] = (lambda: Attention(False), lambda n, g: (_features(n, g), _padding(n)))
    out["mha_weights"] = (lambda: Attention(True), lambda n, g: (_features(n, g), _padding(n)))
    out["decoder"] = (Decoder, lambda n, g: (_features(n, g), _features(n, g)))
    out["sdpa"] = (Sdpa, lambda n, g: (_features(n, g),))
    out["lstm"] = (lambda: Recurrent("lstm"), lambda n, g: (_ids(n, g),))
    out["gru"] = (lambda: Recurrent("gru"), lambda n, g: (_ids(n, g),))

    def bert_batch(n: int, g: torch.Generator) -> tuple:
        types = torch.zeros(n, LENGTH, dtype=torch.long)
        types[:, LENGTH // 2 :] = 1
        mask = torch.ones(n, LENGTH, dtype=torch.long)
        mask[1, LENGTH - 2 :] = 0
        return _ids(n, g), types, mask

    out["bert"] = (Bert, bert_batch)
    # no padding token (id 0) in their batches: an Embedding's padding_idx (whose row PyTorch does not train)
    # is not in an export, so vmem trains every row
    unpadded = lambda n, g: (torch.randint(1, VOCAB, (n, LENGTH), generator=g),)  # noqa: E731
    out["hf_bert"] = (lambda: _Logits(_transformers("bert")), unpadded)
    out["hf_distilbert"] = (lambda: _Logits(_transformers("distilbert")), unpadded)
    out["tied_lm"] = (TiedLM, lambda n, g: (_ids(n, g),))
    out["hf_gpt2"] = (lambda: _Logits(_transformers("gpt2"), last=True), unpadded)
    return out


class _Logits(nn.Module):
    """A model of Hugging Face's transformers called on token ids alone, its logits out (what a user exports);
    with ``last``, a language model's logits at the last position (the next token's)."""

    def __init__(self, model: nn.Module, last: bool = False):
        super().__init__()
        self.model, self.last = model, last

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits
        return logits[:, -1] if self.last else logits


def _transformers(family: str) -> nn.Module:
    """A small sequence classifier of transformers' ``family`` with random weights (no download): the
    library's own modules, as users build them (``transformers`` 5; its default attention)."""
    import transformers as tr

    if family == "gpt2":  # its head tied to its token embedding, as transformers makes it by default
        config = tr.GPT2Config(
            vocab_size=VOCAB,
            n_positions=LENGTH,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            n_inner=FF,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return tr.GPT2LMHeadModel(config)
    if family == "bert":
        config = tr.BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            intermediate_size=FF,
            max_position_embeddings=LENGTH,
            num_labels=CLASSES,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return tr.BertForSequenceClassification(config)
    config = tr.DistilBertConfig(
        vocab_size=VOCAB,
        dim=HIDDEN,
        n_layers=2,
        n_heads=HEADS,
        hidden_dim=FF,
        max_position_embeddings=LENGTH,
        num_labels=CLASSES,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
    )
    return tr.DistilBertForSequenceClassification(config)


def _export(module: nn.Module, xs: tuple, opset: int, dynamic: bool = True) -> bytes:
    """The TorchScript exporter's model (``dynamo=False``) at ``opset``: the batch axis symbolic (``N``), or
    with ``dynamic`` false fixed at the example's, as an export that names no dynamic axes writes it."""
    names = [f"x{i}" for i in range(len(xs))]
    f = io.BytesIO()
    axes = {**{name: {0: "N"} for name in names}, "out": {0: "N"}} if dynamic else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, xs, f, opset_version=opset, dynamo=False, input_names=names, output_names=["out"], dynamic_axes=axes
        )
    return f.getvalue()


def _sources(model: bytes, initial: dict[str, np.ndarray]) -> dict[str, str]:
    """Each initializer of the export -> the parameter it holds (as is, or transposed: a MatMul's weight
    the exporter folded, or written out once a sample of the example batch: a position table the dynamo
    exporter folded; rows of a packed projection; one row of a table repeated at every position; a recurrent
    layer's, its gates reordered and its bias in two: :mod:`parts`), found by value, the first such parameter
    where several are equal."""
    import onnx
    from onnx import numpy_helper

    out = {}
    for tensor in onnx.load_from_string(model).graph.initializer:
        value = numpy_helper.to_array(tensor)
        for key, param in initial.items():
            if param.shape == value.shape and np.array_equal(param, value):
                out[tensor.name] = key
                break
            if param.ndim == 2 and param.T.shape == value.shape and np.array_equal(param.T, value):
                out[tensor.name] = key
                break
            if value.ndim > param.ndim and value[0].size == param.size and (value == value[:1]).all():
                if np.array_equal(value[0].reshape(param.shape), param):  # written out once a sample: the
                    out[tensor.name] = key  # dynamo exporter folds a position table read for its batch so
                    break
        if tensor.name not in out and (part := parts.rows(value, initial)) is not None:
            out[tensor.name] = part  # rows of a packed projection, cut by the exporter's constant folding
        if tensor.name not in out and (part := parts.repeated_row(value, initial)) is not None:
            out[tensor.name] = part  # one row of a table at every position, folded
    graph = onnx.load_from_string(model).graph  # a recurrent layer's weights, its gates in ONNX's order
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    out.update(parts.sources(graph, values, initial))
    return out


def make(name: str, n: int = 3) -> None:
    """Write ``name``'s exports (one per opset of :data:`OPSETS`) and its reference data."""
    build, batch = models()[name]
    torch.manual_seed(0)
    module = build().eval()
    with torch.no_grad():  # layer norms not all ones and zeros, as after training
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
        # every parameter its own values, as after training: a stack's layers are copies of one layer when
        # made, and the exporter merges equal initializers (the importer then unties them, with a warning)
        noise = torch.Generator().manual_seed(3)
        for p in module.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=noise, dtype=p.dtype))
    xs = batch(n, torch.Generator().manual_seed(1))
    initial = {k: v.detach().numpy().copy() for k, v in module.named_parameters()}
    arrays: dict[str, np.ndarray] = {}
    for opset in OPSETS:
        model = _export(module, xs, opset)
        (HERE / f"{name}_opset{opset}.onnx").write_bytes(model)
        arrays[f"sources:{opset}"] = np.array(json.dumps(_sources(model, initial)))
    static = _export(module, xs, STATIC, dynamic=False)
    (HERE / f"{name}_static{STATIC}.onnx").write_bytes(static)
    arrays[f"sources:static{STATIC}"] = np.array(json.dumps(_sources(static, initial)))
    arrays["sources:dynamo"] = np.array(json.dumps(_sources(_export_dynamo(module, xs, name), initial)))
    labels = torch.randint(0, CLASSES, (n,), generator=torch.Generator().manual_seed(2))
    arrays.update({f"x{i}": a.numpy() for i, a in enumerate(xs)})
    arrays.update(_step(module, xs, labels, with_output=True))
    # a batch of another size: what the dynamo export (its batch fixed at the example's) trains at
    xs8 = batch(LARGER, torch.Generator().manual_seed(4))
    labels8 = torch.randint(0, CLASSES, (LARGER,), generator=torch.Generator().manual_seed(5))
    arrays.update({f"b{LARGER}:x{i}": a.numpy() for i, a in enumerate(xs8)})
    arrays.update({f"b{LARGER}:{k}": v for k, v in _step(module, xs8, labels8).items()})
    np.savez_compressed(HERE / f"{name}.npz", **arrays)


#: the batch size of the second reference step (the export's example batch is 3)
LARGER = 8
#: the opset of the TorchScript export without dynamic axes (``NAME_static17.onnx``)
STATIC = 17


def _step(module: nn.Module, xs: tuple, labels: torch.Tensor, with_output: bool = False) -> dict[str, np.ndarray]:
    """PyTorch's own SGD step of a copy of ``module`` on ``xs`` in float64: its loss, labels and parameters
    after it (``param:<name>``), and with ``with_output`` its output before it (``out``)."""
    import copy

    module = copy.deepcopy(module).double().eval()
    doubled = tuple(a.double() if a.is_floating_point() else a for a in xs)
    out = {}
    if with_output:
        with torch.no_grad():
            out["out"] = module(*doubled).numpy()
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    opt.zero_grad()
    loss = F.cross_entropy(module(*doubled), labels)
    loss.backward()
    opt.step()
    out.update(labels=labels.numpy(), loss=np.float64(loss.item()))
    out.update({f"param:{k}": v.detach().numpy() for k, v in module.named_parameters()})
    return out


def _export_dynamo(module: nn.Module, xs: tuple, name: str) -> bytes:
    """``torch.onnx.export(module, xs, path)`` with PyTorch's defaults (the dynamo exporter: its opset, the
    batch fixed at the example's, the weights in ``path.data``), as a user writes it, into
    ``NAME_dynamo.onnx``; the model with its weights, as bytes."""
    import onnx

    from make_vision import scrub  # the corpus's other script, beside this one

    path = HERE / f"{name}_dynamo.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(copy_of(module), xs, str(path))
    scrub(path)
    return onnx.load(str(path)).SerializeToString()


def copy_of(module: nn.Module) -> nn.Module:
    """A copy of ``module`` to export (the dynamo exporter may change the module it traces)."""
    import copy

    return copy.deepcopy(module).eval()


def cli(argv: list[str] | None, doc: str, names: list[str], make_one: Callable[[str], None]) -> int:
    """The corpus scripts' command line: make the models named (every one by default), or ``--list`` them."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="models to make (default: all)")
    parser.add_argument("--list", action="store_true", help="print the models' names and stop")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(names))
        return 0
    unknown = sorted(set(args.names) - set(names))
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)} (see --list)")
    for name in args.names or names:
        make_one(name)
        print(name, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli(argv, __doc__ or "", list(models()), make)


if __name__ == "__main__":
    sys.exit(main())
