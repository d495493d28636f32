"""The loss computed in its work arrays (:class:`vmem.nn.loss.LossWork`, what a step recorded as a CUDA graph
uses so as to ask the array module for nothing) gives the bytes the loss computed with temporaries gives."""

from __future__ import annotations

import numpy as np
import pytest

from vmem.nn.loss import LossWork, SoftmaxCrossEntropy


@pytest.mark.parametrize("shape", [(8, 10), (3, 5, 7), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_loss_in_its_work_arrays_gives_the_same_bytes(shape, dtype):
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(shape) * 20).astype(dtype)
    logits.reshape(-1)[0] = -1e4  # a probability that underflows: the log's floor (finfo.tiny) is taken
    labels = rng.integers(0, shape[-1], shape[:-1])
    loss = SoftmaxCrossEntropy()
    probs, dlogits, value = (
        np.empty_like(logits),
        np.empty_like(logits),
        loss.forward(np, logits, labels, logits.copy()),
    )
    want_probs = logits.copy()
    want = loss.forward(np, logits, labels, want_probs)
    work = LossWork.make(np, shape, dtype)
    got = loss.forward(np, logits, labels, probs, work)
    assert got is work.value and got.tobytes() == np.asarray(want).tobytes() == np.asarray(value).tobytes()
    assert probs.tobytes() == want_probs.tobytes()
    want_grad = np.empty_like(logits)
    loss.backward(np, want_probs, labels, want_grad)
    loss.backward(np, probs, labels, dlogits, work)
    assert dlogits.tobytes() == want_grad.tobytes()
    loss.backward(np, probs, labels, probs, work)  # written over the probabilities
    assert probs.tobytes() == want_grad.tobytes()


def test_a_loss_that_ignores_a_label_computes_as_before_with_work():
    """``ignore`` (PyTorch's -100 here) counts the labels kept on the host: the work arrays are not used, the
    result is the same, and it is PyTorch's: ignored rows get no gradient."""
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
