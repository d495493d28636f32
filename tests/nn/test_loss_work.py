"""The loss computes in its work arrays (:class:`vmem.nn.loss.LossWork`: what a step recorded as a CUDA graph
uses so as to ask the array module for nothing, made for the call where none is given) and gives the bytes
NumPy's plain formula gives: softmax, the label's -log, the mean; p - onehot over the count."""

from __future__ import annotations

import numpy as np
import pytest

from vmem.nn.loss import LossWork, SoftmaxCrossEntropy


def _reference(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loss, probabilities, d(loss)/d(logits)), with temporaries, as NumPy writes it."""
    p = logits - logits.max(axis=-1, keepdims=True)
    np.exp(p, out=p)
    p /= p.sum(axis=-1, keepdims=True)
    p2, l1 = p.reshape(-1, p.shape[-1]), labels.reshape(-1)
    loss = (-np.log(np.maximum(p2[np.arange(len(l1)), l1], np.finfo(p.dtype).tiny))).mean()
    grad = p2.copy()
    grad[np.arange(len(l1)), l1] -= 1
    grad /= len(l1)
    return np.asarray(loss), p, grad.reshape(p.shape)


@pytest.mark.parametrize("given", [True, False], ids=["work", "none"])
@pytest.mark.parametrize("shape", [(8, 10), (3, 5, 7), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_loss_gives_numpys_bytes_in_its_work_arrays(shape, dtype, given):
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(shape) * 20).astype(dtype)
    logits.reshape(-1)[0] = -1e4  # a probability that underflows: the log's floor (finfo.tiny) is taken
    labels = rng.integers(0, shape[-1], shape[:-1])
    loss, work = SoftmaxCrossEntropy(), LossWork.make(np, shape, dtype) if given else None
    want_loss, want_probs, want_grad = _reference(logits, labels)
    probs = np.empty_like(logits)
    got = loss.forward(np, logits, labels, probs, work)
    assert np.asarray(got).tobytes() == want_loss.tobytes() and probs.tobytes() == want_probs.tobytes()
    if given:
        assert got is work.value
    dlogits = np.empty_like(logits)
    loss.backward(np, probs, labels, dlogits, work)
    assert dlogits.tobytes() == want_grad.tobytes()
    loss.backward(np, probs, labels, probs, work)  # written over the probabilities
    assert probs.tobytes() == want_grad.tobytes()


def test_a_loss_that_ignores_a_label_gives_pytorchs_loss_and_gradient():
    """``ignore`` (PyTorch's -100 here) counts the labels kept on the host; ignored rows get no gradient."""
    logits = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    labels = np.array([0, 1, -100, 3, -100, 2])
    loss = SoftmaxCrossEntropy(ignore=-100)
    a, b = logits.copy(), logits.copy()
    want = loss.forward(np, logits, labels, a)
    got = loss.forward(np, logits, labels, b, LossWork.make(np, logits.shape, np.float32))
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    torch = pytest.importorskip("torch")
    t = torch.tensor(logits, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(t, torch.tensor(labels), ignore_index=-100)
    ref.backward()
    assert abs(float(want) - float(ref)) < 1e-6
    grad = np.empty_like(logits)
    loss.backward(np, a, labels, grad)
    assert np.allclose(grad, t.grad.numpy(), rtol=0, atol=1e-7) and not grad[[2, 4]].any()
