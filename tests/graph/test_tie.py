"""Parameters tied across layers (``Network.tie``): a language model's head that is its embedding."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import ShapeError
from vmem.optim import SGD

V, T, H = 7, 5, 4


def _lm(tied: bool) -> vmem.Graph:
    g = vmem.Graph(input_shape=(T,), name="tied" if tied else "separate")
    h = g.add(nn.Embedding(V, H), g.input, name="embed")
    h = g.add(nn.Tanh(), g.add(nn.Linear(H, H), h, name="mix"))
    g.add(nn.Linear(H, V, bias=False), h, name="head")
    if tied:
        g.tie("head.weight", "embed.weight")
    return g


def _batch(n: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (n, T)), rng.integers(0, V, (n, T))


def _pair() -> tuple[vmem.Graph, vmem.Graph]:
    """The tied network and one whose head is a copy of its embedding, from the same values."""
    tied, separate = _lm(True), _lm(False)
    separate.init(0, dtype="float64")
    separate.params["head.weight"] = separate.params["embed.weight"].copy()
    tied.init(0, dtype="float64")
    tied.params.update({k: v.copy() for k, v in separate.params.items() if k in tied.params})
    return tied, separate


def test_a_tied_parameter_is_one_array_trained_with_the_sum_of_both_gradients():
    tied, separate = _pair()
    assert "head.weight" not in tied.params and "head.weight" not in tied.param_specs()
    assert tied.num_params() == separate.num_params() - V * H
    before = tied.params["embed.weight"].copy()
    x, y = _batch()
    for net in (tied, separate):
        with vmem.Trainer(net, policy="layerwise", optimizer=SGD(lr=0.1), dtype="float64", seed=0) as t:
            t.step(x, y)
            t.sync()
    moved = (separate.params["embed.weight"] - before) + (separate.params["head.weight"] - before)
    assert np.abs(moved).max() > 1e-3
    np.testing.assert_allclose(tied.params["embed.weight"] - before, moved, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(tied.params["mix.weight"], separate.params["mix.weight"])


@pytest.mark.parametrize("policy", ["baseline", "auto", "vdnn-all", "echo"])
def test_every_policy_trains_a_tied_network_as_the_baseline_does(policy):
    x, y = _batch(8, seed=1)
    out = {}
    for name in ("layerwise", policy):
        net, _ = _pair()
        with vmem.Trainer(net, policy=name, optimizer=vmem.optim.Adam(lr=0.01), seed=0) as t:
            for _ in range(2):
                t.step(x, y)
            t.sync()
        out[name] = net.params
    for k in out["layerwise"]:
        np.testing.assert_array_equal(out[policy][k], out["layerwise"][k], err_msg=k)


def test_micro_batches_sum_a_tied_gradient_over_the_micro_batches():
    x, y = _batch(64, seed=2)
    net, _ = _pair()
    small = vmem.plan(net, 16, "cpu", "layerwise", dtype="float64").peak_bytes
    out, micro = [], []
    for memory in (None, small):
        net, _ = _pair()
        with vmem.Trainer(
            net, policy="layerwise:microbatch=on", memory=memory, optimizer=SGD(lr=0.1), dtype="float64", seed=0
        ) as t:
            t.step(x, y)
            t.sync()
            micro.append(t.plans[64].microbatch)
        out.append(net.params["embed.weight"])
    assert micro[0] == 1 and micro[1] > 1
    np.testing.assert_allclose(out[1], out[0], rtol=1e-12, atol=1e-14)


def test_a_tie_is_checked_by_name_and_shape():
    g = _lm(False)
    g.tie("head.weight", "embed.weights")
    with pytest.raises(ShapeError, match="no parameter 'embed.weights'"):
        g.build(2)
    g = _lm(False)
    g.tie("mix.weight", "embed.weight")
    with pytest.raises(ShapeError, match=r"tie\('mix.weight', 'embed.weight'\): shapes \(4, 4\) and \(7, 4\)"):
        g.build(2)
    g = _lm(True)
    g.tie("embed.weight", "mix.weight")
    with pytest.raises(ShapeError, match="is tied to"):
        g.build(2)
    with pytest.raises(ValueError, match="to itself"):
        _lm(False).tie("head.weight", "head.weight")


def test_a_tied_network_saves_one_initializer_and_loads_back_tied(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import onnx

    net, _ = _pair()
    net.params = {k: v.astype(np.float32) for k, v in net.params.items()}
    vmem.onnx.save(net, tmp_path / "lm.onnx")
    model = onnx.load(str(tmp_path / "lm.onnx"))
    assert "head.weight" not in {i.name for i in model.graph.initializer}
    x, _ = _batch(3)
    with vmem.Trainer(net) as t:
        want = t.predict(x)
    session = ort.InferenceSession(str(tmp_path / "lm.onnx"))
    got = session.run(None, {session.get_inputs()[0].name: x.astype(np.int64)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    back = vmem.onnx.load(tmp_path / "lm.onnx")
    assert len(back.ties) == 1 and back.num_params() == net.num_params()


def test_a_checkpoint_of_a_tied_network_resumes_bit_for_bit(tmp_path):
    x, y = _batch(8, seed=3)
    runs = []
    for resume in (False, True):
        net, _ = _pair()
        with vmem.Trainer(net, optimizer=vmem.optim.Adam(lr=0.01), seed=0) as t:
            t.step(x, y)
            if resume:
                t.save(tmp_path / "ck.vmem")
                net2, _ = _pair()
                with vmem.Trainer(net2, optimizer=vmem.optim.Adam(lr=0.01), seed=0) as t2:
                    t2.load(tmp_path / "ck.vmem")
                    t2.step(x, y)
                    t2.sync()
                runs.append(net2.params)
            else:
                t.step(x, y)
                t.sync()
                runs.append(net.params)
    for k in runs[0]:
        np.testing.assert_array_equal(runs[1][k], runs[0][k], err_msg=k)


@pytest.mark.parametrize("sharded", [False, True])
def test_two_ranks_train_a_tied_network_as_one_process_does(sharded):
    """Data parallel: the tied gradient (both uses summed) all-reduced once; with the optimizer sharded, the
    one rank that keeps its state updates it for both layers."""
    from tests.distributed.dp_worker import on_ranks
    from vmem.distributed import ThreadGroup, shard

    x, y = _batch(8, seed=4)

    def rank(g: ThreadGroup) -> dict:
        net, _ = _pair()
        with vmem.Trainer(net, group=g, shard_optimizer=sharded, optimizer=SGD(lr=0.1), dtype="float64") as t:
            s = shard(8, g.rank, g.size)
            t.step(x[s], y[s])
            t.sync()
        return net.params

    alone, _ = _pair()
    with vmem.Trainer(alone, optimizer=SGD(lr=0.1), dtype="float64") as t:
        t.step(x, y)
        t.sync()
    for params in on_ranks(2, rank):
        assert params.keys() == alone.params.keys()
        for k, v in alone.params.items():
            np.testing.assert_allclose(params[k], v, rtol=1e-12, atol=1e-14, err_msg=k)
