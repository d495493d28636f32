"""Networks of several inputs (token ids beside a mask, a model imported with two): every input is a tensor
of the program, uploaded from the batch; every policy trains them to the same weights as baseline; the
Trainer takes a tuple of arrays and says clearly what it wants otherwise."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import ShapeError
from vmem.schedule.lower import lower
from vmem.schedule.steps import Upload

SPEC = vmem.device("sim:titan-x").spec


def _two_inputs():
    g = vmem.Graph(input_shape=(6,), name="two")
    gate = g.add_input((6,), "gate")
    a = g.add(nn.Tanh(), g.add(nn.Linear(6, 8), g.input))
    b = g.add(nn.Sigmoid(), g.add(nn.Linear(6, 8), gate))
    g.add(nn.Linear(8, 3), g.add(nn.Mul(), a, b))
    return g


def _batch(n=5, seed=0):
    rng = np.random.default_rng(seed)
    x, gate = (rng.standard_normal((n, 6)).astype(np.float32) for _ in range(2))
    return x, gate, rng.integers(0, 3, n)


def test_each_input_is_a_tensor_of_the_program_uploaded_by_its_name():
    net = _two_inputs()
    assert [n.name for n in net.inputs] == ["input", "gate"] and net.input_shapes() == [(6,), (6,)]
    program = net.build(4)
    assert program.input_tensors == (0, 1) and program.tensors[1].name == "gate"
    assert program.tensors[1].shape == (4, 6) and program.tensors[1].producer is None
    for policy in ("baseline", "vdnn-all"):  # network-wide and layer-wise lowerings
        steps = lower(program, vmem.policies.get(policy).decide(program, SPEC)).steps
        assert sorted(st.source for st in steps if isinstance(st, Upload)) == ["gate", "input", "labels"]
    with pytest.raises(ValueError, match="a name of its own"):
        net.add_input((6,), "gate")


@pytest.mark.parametrize("policy", ["layerwise", "vdnn-all", "vdnn-conv", "echo", "chen", "mirror"])
def test_every_policy_trains_a_network_of_two_inputs_as_baseline(policy):
    x, gate, y = _batch()
    weights = []
    for spec in ("baseline", policy):
        net = _two_inputs().init(seed=1)
        with vmem.Trainer(net, policy=spec, memory="16MiB", optimizer=vmem.optim.SGD(lr=0.1, momentum=0.9)) as t:
            for _ in range(3):
                t.step((x, gate), y)
            t.sync()
            out = t.predict((x, gate))
        weights.append((dict(net.params), out))
    for key, value in weights[0][0].items():
        np.testing.assert_array_equal(weights[1][0][key], value, err_msg=key)
    np.testing.assert_array_equal(weights[1][1], weights[0][1])


def test_the_second_input_matters_and_the_trainer_says_what_it_takes():
    x, gate, y = _batch()
    net = _two_inputs().init(seed=1)
    with vmem.Trainer(net) as t:
        assert not np.allclose(t.predict((x, gate)), t.predict((x, -gate)))
        np.testing.assert_allclose(t.predict((x, gate), batch_size=2), t.predict((x, gate)), rtol=1e-6)
        with pytest.raises(ShapeError, match=r"takes 2 inputs \(input, gate\): give a tuple of arrays"):
            t.step(x, y)
        with pytest.raises(ShapeError, match="input 'gate' has shape \\(5, 4\\), the network takes \\(N, 6\\)"):
            t.step((x, gate[:, :4]), y)
        with pytest.raises(ShapeError, match="hold \\[5, 3\\] samples"):
            t.predict((x, gate[:3]))
