"""One registry style: models, codecs, policies and GPU sheets are each added with ``register`` and found by
``get`` and ``names``; a user's model and codec then work wherever a built-in one does."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import codecs, models, nn
from vmem.cli import main
from vmem.codecs.base import Codec, Encoded


def test_a_registered_model_trains_from_the_command_line(capsys):
    @models.register("tiny_mlp", description="two linear layers for 8x8 digits")
    def tiny_mlp(num_classes: int = 10, image_size: int = 8) -> vmem.Sequential:
        return vmem.Sequential(
            nn.Flatten(),
            nn.Linear(image_size * image_size, 32),
            nn.ReLU(),
            nn.Linear(32, num_classes),
            input_shape=(1, image_size, image_size),
            name="tiny_mlp",
        )

    try:
        assert "tiny_mlp" in models.names() and models.info("tiny_mlp") == "two linear layers for 8x8 digits"
        assert models.get("tiny_mlp").name == "tiny_mlp"
        with pytest.raises(ValueError, match="already registered"):
            models.register("tiny_mlp", tiny_mlp)
        assert main(["train", "--model", "tiny_mlp", "--epochs", "1", "--policy", "baseline"]) == 0
        assert "val accuracy" in capsys.readouterr().out
    finally:
        models._ZOO.pop("tiny_mlp", None)


class _Halve(Codec):
    """A test codec: stores each value as float16 (lossy)."""

    name = "halve"
    lossless = False

    def encode(self, x, **kwargs):
        return Encoded(self, tuple(x.shape), x.dtype, {"v": np.asarray(x, np.float16)})

    def decode(self, enc, out=None):
        out = np.empty(enc.shape, enc.dtype) if out is None else out
        out[...] = enc.arrays["v"]
        return out

    def encoded_nbytes(self, shape, dtype="float32", density=None):
        return int(np.prod(shape)) * 2


def test_a_registered_codec_is_found_by_name():
    codecs.register(_Halve)
    try:
        assert "halve" in codecs.names() and isinstance(codecs.get("halve"), _Halve)
        x = np.linspace(-1, 1, 64, dtype=np.float32)
        assert np.allclose(codecs.get("halve").decode(codecs.get("halve").encode(x)), x, atol=1e-3)
        with pytest.raises(ValueError, match="name of its own"):
            codecs.register(type("Nameless", (_Halve,), {"name": "fp8"}))
    finally:
        codecs._CODECS.pop("halve", None)


def test_every_registry_has_get_names_and_register():
    for registry in (vmem.models, vmem.codecs, vmem.policies, vmem.device.specs):
        assert callable(registry.get) and callable(registry.names) and callable(registry.register)
