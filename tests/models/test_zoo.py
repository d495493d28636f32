"""The zoo builds at default and smaller sizes; bad definitions name the layer and both shapes."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import ShapeError

SMALLER = {
    "overfeat": 199,
    "alexnet": 127,
    "googlenet": 128,
    "nin": 160,
    "vgg_cifar": 16,
    "resnet_cifar": 16,
    "digits_cnn": 16,
    "mini_googlenet": 16,
    "vit": 16,
    "mobilenet_v3": 32,  # five strided stages: its least
}

SEQUENCE = {"nmt": (2, 100, 7709), "nmt_small": (2, 8, 50), "transformer": (2, 128, 32000)}
IMAGES = [n for n in vmem.models.names() if n not in SEQUENCE]

PARAMS = {"alexnet": 61_100_840, "vgg16": 138_357_544, "resnet50": 25_557_032, "resnet18": 11_689_512}


@pytest.mark.parametrize("name", sorted(SEQUENCE))
def test_sequence_models_predict_a_token_per_position(name):
    net = vmem.models.get(name)
    program = net.build(2)
    assert program.tensors[program.output].shape == SEQUENCE[name]
    assert program.label_shape == SEQUENCE[name][:2]
    shared = [op for op in program.ops if op.shares]
    assert bool(shared) == name.startswith("nmt")  # unrolled time steps share their weights
    if name == "transformer":
        assert len([op for op in vmem.models.get(name, layers=2).build(1).ops if op.kind == "layernorm"]) == 4


@pytest.mark.parametrize("name", IMAGES)
def test_every_model_builds_at_its_default_size(name):
    net = vmem.models.get(name)
    program = net.build(2)
    small = ("vgg_cifar", "resnet_cifar", "digits_cnn", "digits_vgg", "mini_googlenet", "vit", "mobilenet_v3")
    classes = 10 if name in small else 1000
    assert program.tensors[program.output].shape == (2, classes)
    assert program.flops > 0
    net = vmem.models.get(name, num_classes=7)
    assert net.output_shape(3) == (3, 7)


@pytest.mark.parametrize("name", IMAGES)
def test_every_model_builds_at_a_smaller_size(name):
    size = SMALLER.get(name, 112)
    net = vmem.models.get(name, image_size=size)
    assert net.input_shape[1:] == (size, size)
    assert net.output_shape(1)[0] == 1


@pytest.mark.parametrize("name, count", sorted(PARAMS.items()))
def test_parameter_counts_match_the_reference_models(name, count):
    assert vmem.models.get(name).num_params() == count


def test_reference_shapes():
    vgg = vmem.models.get("vgg16").build(1)
    assert vgg.tensor("flatten1").shape == (1, 25088)
    overfeat = vmem.models.get("overfeat").build(1)
    assert overfeat.tensor("flatten1").shape == (1, 36864)
    alex = vmem.models.get("alexnet").build(1)
    assert alex.tensor("flatten1").shape == (1, 9216)
    goog = vmem.models.get("googlenet").build(1)
    assert goog.tensor("inception5b").shape == (1, 1024, 7, 7)
    assert goog.tensor("inception3a").shape == (1, 256, 28, 28)
    assert len([op for op in vmem.models.get("vgg116").build(1).ops if op.kind == "conv"]) == 113
    r = vmem.models.get("resnet_cifar", depth=164).build(1)
    assert len([op for op in r.ops if op.kind == "conv"]) == 163 + 3  # 3 projection shortcuts


def test_resnet_cifar_depth_is_validated():
    with pytest.raises(ValueError, match="6n\\+2"):
        vmem.models.get("resnet_cifar", depth=21)
    with pytest.raises(ValueError, match="unknown model 'vgg17'"):
        vmem.models.get("vgg17")


def test_channel_mismatch_names_the_layer_and_both_shapes():
    net = vmem.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(4, 8, 3), input_shape=(3, 16, 16))
    with pytest.raises(
        ShapeError, match=r"'conv2' \(Conv2d\): expects input of shape \(N, 4, H, W\), got \(1, 8, 14, 14\)"
    ):
        net.build(1)


def test_linear_mismatch_names_the_layer_and_both_shapes():
    net = vmem.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(100, 10), input_shape=(3, 8, 8))
    with pytest.raises(ShapeError, match=r"'linear1' \(Linear\): expects input of shape \(N, 100\), got \(2, 144\)"):
        net.build(2)


def test_join_mismatch():
    g = vmem.Graph(input_shape=(3, 8, 8))
    a = g.add(nn.Conv2d(3, 4, 3, padding=1), g.input)
    b = g.add(nn.Conv2d(3, 5, 3, padding=1), g.input)
    g.add(nn.Add(), a, b, name="join")
    with pytest.raises(ShapeError, match=r"'join' \(Add\): cannot add shapes \(1, 4, 8, 8\) and \(1, 5, 8, 8\)"):
        g.build(1)


def test_a_kernel_larger_than_the_input():
    net = vmem.Sequential(nn.Conv2d(3, 4, 7), nn.Flatten(), nn.Linear(4, 2), input_shape=(3, 5, 5))
    with pytest.raises(ShapeError, match="does not fit input of shape \\(1, 3, 5, 5\\)"):
        net.build(1)


def test_vgg_starts_as_torchvisions_and_learns_at_its_default_rate():
    """vgg_cifar has no batch norm: from He's fan-in init its logits started with a standard deviation near
    7 on the synthetic data and SGD at its default rate diverged (as PyTorch does with those weights). With
    torchvision's fan-out init for its convolutions, the logits start small and a few steps lower the loss."""
    net = vmem.models.get("vgg_cifar")
    assert {layer.init for layer in net.layers if layer.kind == "conv"} == {"he_out"}
    train, _ = vmem.data.synthetic(64, (3, 32, 32), 10, seed=0)
    with vmem.Trainer(net, policy="baseline", memory="1GiB", seed=0) as trainer:
        assert float(np.std(trainer.predict(train.x[:32]))) < 1  # was 6.9
        losses = [trainer.step(train.x[:32], train.y[:32]).loss for _ in range(6)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] < 3  # was 11.4, then nan
