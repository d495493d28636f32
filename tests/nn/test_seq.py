"""Sequence models: shared weights, token labels, nmt_small training, recompute on an attention model."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.optim import SGD

from tests.lossless import all_equal, weights_under


def test_a_shared_layer_sums_the_gradients_of_its_uses():
    """One SGD step: the shared weight moves by the sum of what two separate copies of it move by."""

    def make(shared):
        g = vmem.Graph(input_shape=(4,), name="shared" if shared else "separate")
        first = nn.Linear(4, 4)
        a = g.add(first, g.input, name="lin")
        b = g.reuse(first, g.add(nn.Tanh(), a)) if shared else g.add(nn.Linear(4, 4), g.add(nn.Tanh(), a), name="lin2")
        g.add(nn.Linear(4, 3), g.add(nn.Tanh(), b), name="head")
        return g

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)
    shared, separate = make(True), make(False)
    shared.init(0)
    separate.init(0)
    for k in ("weight", "bias"):
        separate.params[f"lin2.{k}"] = separate.params[f"lin.{k}"].copy()
        shared.params[f"lin.{k}"] = separate.params[f"lin.{k}"].copy()
    shared.params.update({k: v.copy() for k, v in separate.params.items() if k.startswith("head")})
    assert "lin@1.weight" not in shared.params and len(shared.params) == 4
    before = shared.params["lin.weight"].copy()
    for net in (shared, separate):
        with vmem.Trainer(net, policy="layerwise", optimizer=SGD(lr=0.1), seed=0) as t:
            t.step(x, y)
            t.sync()
    moved = (separate.params["lin.weight"] - before) + (separate.params["lin2.weight"] - before)
    np.testing.assert_allclose(shared.params["lin.weight"] - before, moved, rtol=1e-4, atol=1e-6)


def test_nmt_small_learns_to_reverse_sequences():
    train, val = vmem.data.reverse(n=4096, seed=1)
    net = vmem.models.get("nmt_small")
    with vmem.Trainer(net, policy="echo", optimizer=vmem.optim.Adam(lr=0.01), seed=0) as trainer:
        history = trainer.fit(train, epochs=3, val=val, batch_size=64, progress=False)
    assert history.epochs[-1].val_accuracy >= 0.95


def test_labels_must_match_the_token_outputs():
    net = vmem.models.get("nmt_small")
    x, y = vmem.data.reverse(n=64)[0].x[:4], np.zeros((4, 7), np.int64)
    with vmem.Trainer(net, seed=0) as trainer, pytest.raises(vmem.errors.ShapeError, match="one label per token"):
        trainer.step(x, y)


def test_padding_is_ignored_by_the_loss_and_the_attention():
    train, _ = vmem.data.reverse(n=64, min_len=3, seed=2)
    assert (train.y == 0).any() and (train.x[:, :8] == 0).any()
    loss = nn.SoftmaxCrossEntropy(ignore=0)
    logits = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    labels = np.array([[1, 2, 0], [3, 0, 0]])
    probs = np.empty_like(logits)
    value = loss.forward(np, logits, labels, probs)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = -np.log([p[0, 0, 1], p[0, 1, 2], p[1, 0, 3]]).mean()
    assert abs(value - want) < 1e-6
    d = np.empty_like(logits)
    loss.backward(np, probs, labels, d)
    assert not d[0, 2].any() and not d[1, 1:].any()


def test_recompute_on_nmt_small_with_dropout_is_bitwise_lossless():
    def make():
        return vmem.models.get("nmt_small", dropout=0.2)

    data, _ = vmem.data.reverse(n=64, seed=3)
    weights = weights_under(make, ("baseline", "mirror", "chen", "echo"), data.x[:16], data.y[:16], steps=5)
    assert all_equal(weights)


def test_echo_on_a_tensor_broadcast_into_t_ops():
    """Echo's second example: a (T, N) tensor added to each of T queries, tanh, then a linear layer reads
    each: T * T N stashed under layer-wise allocation; echo keeps the (T, N) tensor and rebuilds one sum at a
    time, about 2 T N."""
    T, N, B = 16, 32, 4
    g = vmem.Graph(input_shape=(T, N), name="broadcast")
    keys = g.add(nn.Linear(N, N, bias=False), g.input, name="keys")
    queries = g.add(nn.Linear(N, N, bias=False), g.input, name="queries")
    scores = []
    for t, q in enumerate(g.split(queries, T, axis=1)):
        e = g.add(nn.Tanh(), g.add(nn.Add(), keys, q, name=f"e{t}"))
        scores.append(g.add(nn.Linear(N, 1, bias=False), e, name=f"v{t}"))
    g.add(nn.Concat(axis=2), *scores)  # (B, T, T): a prediction per position
    tn = B * T * N * 4
    layerwise = vmem.plan(g, B, policy="layerwise")
    echo = vmem.plan(g, B, policy="echo")
    kept = [n for n, d in layerwise.stash.items() if n.startswith("e")]
    assert len(kept) == T  # T tensors of T N each
    assert sum(1 for n, d in echo.stash.items() if n.startswith("e") and d == "recompute") == T
    assert echo.stash["keys"] == "keep"
    program = g.build(B)

    def held(plan):  # bytes kept from forward to backward
        return sum(program.tensor(n).nbytes for n, d in plan.stash.items() if d == "keep")

    assert held(layerwise) >= T * tn
    assert held(echo) <= 2 * tn + B * T * N * 4  # the input, the keys and the T small queries
    assert echo.peak_bytes < layerwise.peak_bytes / 2


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 3, 1, 2), (0, 2, 3, 1), (0, 1, 3, 2)])
def test_transpose_permutes_the_logical_axes_of_a_stored_map(perm):
    """A 4-D map is stored channels-last: the layer's stored output, read back in NCHW order, is NumPy's
    transpose of the NCHW input."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    layer = nn.Transpose(perm)
    out = layer.output_shape([x.shape])
    y = np.empty(nn.physical(out))
    layer.forward(nn.Ctx(xp=np), [x.transpose(0, 2, 3, 1)], y)
    np.testing.assert_array_equal(y.transpose(0, 3, 1, 2), x.transpose(perm))
    with pytest.raises(ValueError, match="the batch axis first"):
        nn.Transpose((1, 0, 2))
