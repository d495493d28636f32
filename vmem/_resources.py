"""Files the installed package reads at run time: the C and CUDA sources in ``vmem/csrc`` (the cuDNN
declarations cffi reads, the encoding kernels NVRTC compiles). They ship in the wheel as package data."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CSRC", "source_file"]

#: The folder of vmem's C and CUDA sources, inside the package.
CSRC = Path(__file__).resolve().parent / "csrc"


def source_file(name: str) -> Path:
    """The path of ``vmem/csrc/<name>``; FileNotFoundError naming the file if this installation lacks it."""
    path = CSRC / name
    if not path.is_file():
        raise FileNotFoundError(
            f"vmem's source file {name} is not in {CSRC}: this installation of vmem is "
            "incomplete; reinstall it (pip install --force-reinstall vmem)"
        )
    return path
