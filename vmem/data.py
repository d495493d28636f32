"""Datasets: scikit-learn's bundled digits (no download), seeded synthetic images, batching.

Images are float32 NCHW; labels int64. ``digits`` needs scikit-learn (``pip install vmem[data]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

__all__ = ["Dataset", "digits", "synthetic", "load"]


@dataclass
class Dataset:
    """Images ``x`` (N, C, H, W) float32 and labels ``y`` (N,) int64."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str = "dataset"

    def __post_init__(self) -> None:
        if self.x.ndim != 4:
            raise ValueError(f"{self.name}: images must be (N, C, H, W), got shape {self.x.shape}")
        if len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: {len(self.x)} images but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])  # type: ignore[return-value]

    def batches(self, batch_size: int, *, shuffle: bool = False, rng: np.random.Generator | None = None,
                drop_last: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (x, y) batches; ``shuffle`` draws a permutation from ``rng``."""
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be positive")
        n = len(self)
        order = (rng or np.random.default_rng()).permutation(n) if shuffle else np.arange(n)
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            yield self.x[idx], self.y[idx]

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        return len(self) // batch_size if drop_last else -(-len(self) // batch_size)

    def split(self, val_fraction: float, seed: int = 0) -> tuple["Dataset", "Dataset"]:
        """A seeded, stratified split into (train, val)."""
        rng = np.random.default_rng(seed)
        val_idx = []
        for c in range(self.num_classes):
            idx = np.flatnonzero(self.y == c)
            rng.shuffle(idx)
            val_idx.extend(idx[: int(round(len(idx) * val_fraction))])
        mask = np.zeros(len(self), bool)
        mask[val_idx] = True
        return (Dataset(self.x[~mask], self.y[~mask], self.num_classes, f"{self.name}-train"),
                Dataset(self.x[mask], self.y[mask], self.num_classes, f"{self.name}-val"))


def _resize(x: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of (N, C, H, W) to size x size."""
    n, c, h, w = x.shape
    if (h, w) == (size, size):
        return x

    def axis(src: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = (np.arange(size) + 0.5) * src / size - 0.5
        pos = np.clip(pos, 0, src - 1)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, src - 1)
        return lo, hi, (pos - lo).astype(x.dtype)

    rl, rh, rf = axis(h)
    cl, ch, cf = axis(w)
    rows = x[:, :, rl, :] * (1 - rf)[:, None] + x[:, :, rh, :] * rf[:, None]
    return (rows[:, :, :, cl] * (1 - cf) + rows[:, :, :, ch] * cf).astype(x.dtype)


def digits(image_size: int = 8, channels: int = 1, val_fraction: float = 0.2, seed: int = 0
           ) -> tuple[Dataset, Dataset]:
    """scikit-learn's 1,797 8x8 handwritten digits, standardized, optionally upsampled and repeated over
    ``channels``; returns a stratified (train, val) split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the digits dataset needs scikit-learn: pip install 'vmem[data]'") from exc
    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None]
    x = (x - 0.3) / 0.4
    x = _resize(x, image_size)
    if channels > 1:
        x = np.repeat(x, channels, axis=1)
    data = Dataset(np.ascontiguousarray(x, dtype=np.float32), bunch.target.astype(np.int64), 10, "digits")
    return data.split(val_fraction, seed)


def synthetic(n: int = 1024, input_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
              seed: int = 0, val_fraction: float = 0.2) -> tuple[Dataset, Dataset]:
    """Seeded images that are learnable: each class is a fixed random pattern plus noise."""
    rng = np.random.default_rng(seed)
    patterns = rng.standard_normal((num_classes,) + tuple(input_shape)).astype(np.float32)
    y = rng.integers(0, num_classes, n)
    x = patterns[y] + rng.standard_normal((n,) + tuple(input_shape)).astype(np.float32) * 1.5
    data = Dataset(x.astype(np.float32), y.astype(np.int64), num_classes, "synthetic")
    return data.split(val_fraction, seed)


def load(name: str, input_shape: tuple[int, int, int] | None = None, seed: int = 0, n: int = 1024
         ) -> tuple[Dataset, Dataset]:
    """A dataset by name, shaped for a model's ``input_shape`` (C, H, W): ``digits`` or ``synthetic``."""
    if name == "digits":
        c, h, _ = input_shape or (1, 8, 8)
        return digits(image_size=h, channels=c, seed=seed)
    if name == "synthetic":
        return synthetic(n=n, input_shape=input_shape or (3, 32, 32), seed=seed)
    raise ValueError(f"unknown dataset {name!r}; use 'digits' or 'synthetic'")
