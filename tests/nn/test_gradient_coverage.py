"""Every public layer of ``vmem.nn`` (and the loss) has its backward checked against finite differences:
a layer added without a gradient check fails here."""

from __future__ import annotations

import re
from pathlib import Path

from vmem import nn
from vmem.nn.base import Layer

HERE = Path(__file__).resolve().parent


def _public_layers() -> list[str]:
    return [
        name
        for name in nn.__all__
        if isinstance(getattr(nn, name), type)
        and (issubclass(getattr(nn, name), Layer) and name != "Layer" or name == "SoftmaxCrossEntropy")
    ]


def test_every_public_layer_has_a_gradient_check():
    checks = "".join(
        p.read_text()
        for p in HERE.glob("test_*.py")
        if "check_layer(" in p.read_text() or "finite differences" in p.read_text()
    )
    missing = [name for name in _public_layers() if not re.search(rf"\bnn\.{name}\b", checks)]
    assert len(_public_layers()) >= 20 and not missing, f"no gradient check for {missing}"
