"""Program: execution order, reference counts, stash, in-place aliasing."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn


def test_program_of_a_chain():
    net = vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
        input_shape=(3, 8, 8),
    )
    p = net.build(4)
    assert [op.name for op in p.ops] == ["conv1", "relu1", "maxpool1", "flatten1", "linear1"]
    conv_out = p.tensor("conv1")
    relu_out = p.tensor("relu1")
    assert relu_out.buffer == conv_out.id  # ReLU in place over the convolution's output
    assert p.ops[1].inplace and p.ops[3].inplace
    assert relu_out.stashed  # ReLU's backward needs its sign; max-pool saves only an argmax map
    assert not conv_out.stashed
    assert p.tensors[0].stashed  # the convolution's backward needs its input
    assert p.tensor("flatten1").stashed  # the linear layer's backward needs its input
    assert conv_out.consumers == [1] and p.tensors[0].consumers == [0]
    assert p.ops[2].aux_nbytes == {"argmax": 4 * 4 * 4 * 8 // 2}  # 4 bits per output
    assert p.tensors[p.output].shape == (4, 10) and p.num_classes == 10


def test_fork_and_join_reference_counts_and_no_in_place_on_shared_inputs():
    g = vmem.Graph(input_shape=(3, 8, 8))
    c = g.add(nn.Conv2d(3, 4, 3, padding=1), g.input)
    r1 = g.add(nn.ReLU(), c)
    r2 = g.add(nn.Conv2d(4, 4, 1), c)  # c has two consumers: the ReLU must not overwrite it
    s = g.add(nn.Add(), r1, r2)
    g.add(nn.Linear(4 * 8 * 8, 3), g.add(nn.Flatten(), s))
    p = g.build(2)
    assert p.tensor("conv1").consumers == [1, 2]
    assert not p.ops[1].inplace
    assert p.tensor("relu1").buffer == p.tensor("relu1").id
    assert p.tensor("conv1").stashed  # conv2 reads it in backward


def test_unused_branches_are_not_run():
    g = vmem.Graph(input_shape=(3, 8, 8))
    a = g.add(nn.Conv2d(3, 4, 3), g.input)
    g.add(nn.Conv2d(3, 4, 3), g.input)  # dead end
    out = g.add(nn.Linear(4 * 6 * 6, 2), g.add(nn.Flatten(), a))
    g.output(out)
    assert [op.name for op in g.build(1).ops] == ["conv1", "flatten1", "linear1"]


def test_layer_names_are_unique():
    g = vmem.Graph(input_shape=(3, 8, 8))
    g.add(nn.ReLU(), g.input, name="a")
    with pytest.raises(ValueError, match="two layers are named 'a'"):
        g.add(nn.ReLU(), g.input, name="a")
    layer = nn.ReLU()
    g.add(layer, g.input)
    with pytest.raises(ValueError, match="already in the network"):
        g.add(layer, g.input)


def test_a_network_needs_an_input_shape_and_its_loss_takes_its_output():
    net = vmem.Sequential(nn.Conv2d(3, 4, 3))
    with pytest.raises(vmem.errors.ShapeError, match="input_shape"):
        net.build(1)
    assert net.build(2, input_shape=(3, 8, 8)).tensors[-1].shape == (2, 4, 6, 6)  # an output of any shape
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with vmem.Trainer(net, input_shape=(3, 8, 8)) as trainer:
        assert trainer.predict(x).shape == (2, 4, 6, 6)  # in NCHW order, as the network computes it
        with pytest.raises(vmem.errors.ShapeError, match="loss SoftmaxCrossEntropy.*a classifier must end in"):
            trainer.step(x, np.zeros(2, np.int64))


def test_layers_choose_their_weights_initializer():
    net = vmem.Sequential(
        nn.Conv2d(3, 64, 3, padding=1, init="he_out"),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 500, init="small"),
        nn.Linear(500, 400, init="normal"),
        input_shape=(3, 8, 8),
    ).init(seed=0)
    conv, small, lecun = (net.params[f"{k}.weight"] for k in ("conv1", "linear1", "linear2"))
    assert abs(conv.std() / np.sqrt(2 / (64 * 9)) - 1) < 0.05  # fan_out = 64 filters x 3 x 3
    assert abs(small.std() / 0.01 - 1) < 0.02
    assert abs(lecun.std() / np.sqrt(1 / 500) - 1) < 0.02
    assert "init='he_out'" in repr(net) and "init='small'" in repr(net)
    for make in (lambda: nn.Conv2d(3, 4, 3, init="xavier"), lambda: nn.Linear(3, 4, init="kaiming")):
        with pytest.raises(ValueError, match=r"init='(xavier|kaiming)' is not an initializer; choose one of he"):
            make()
