"""Datasets: scikit-learn's bundled digits (no download), seeded synthetic images, token sequences to
reverse, batching.

Images are float32 NCHW; labels int64. Token sequences are float32 ids (N, 2T) with labels (N, T).
``digits`` needs scikit-learn (``pip install vmem[data]``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .units import format_bytes

__all__ = ["Dataset", "digits", "synthetic", "reverse", "load"]


@dataclass
class Dataset:
    """Inputs ``x`` (images (N, C, H, W) float32, or token ids) and labels ``y`` (N,) or (N, T) int64."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str = "dataset"

    def __post_init__(self) -> None:
        if self.x.ndim < 2:
            raise ValueError(f"{self.name}: inputs must have a batch axis and features, got shape {self.x.shape}")
        if len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: {len(self.x)} images but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])  # type: ignore[return-value]

    def batches(
        self, batch_size: int, *, shuffle: bool = False, rng: np.random.Generator | None = None, drop_last: bool = False
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
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
        val_idx: list[np.ndarray] = []
        strata = self.y if self.y.ndim == 1 else np.zeros(len(self), np.int64)  # sequences: no strata
        for c in range(self.num_classes):
            idx = np.flatnonzero(strata == c)
            rng.shuffle(idx)
            val_idx.extend(idx[: int(round(len(idx) * val_fraction))])
        mask = np.zeros(len(self), bool)
        mask[val_idx] = True
        return (
            Dataset(self.x[~mask], self.y[~mask], self.num_classes, f"{self.name}-train"),
            Dataset(self.x[mask], self.y[mask], self.num_classes, f"{self.name}-val"),
        )


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


def digits(image_size: int = 8, channels: int = 1, val_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """scikit-learn's 1,797 8x8 handwritten digits, standardized, optionally upsampled and repeated over
    ``channels``; returns a stratified (train, val) split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the digits dataset needs scikit-learn: pip install 'vmem[data]'") from exc
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"digits: image_size={image_size!r} must be a positive int")
    bunch = load_digits()
    # the upsampling holds about three copies of the images at once
    _check_room(f"the digits at {image_size}x{image_size}", 3 * len(bunch.images) * channels * image_size**2 * 4)
    x = (bunch.images.astype(np.float32) / 16.0)[:, None]
    x = (x - 0.3) / 0.4
    x = _resize(x, image_size)
    if channels > 1:
        x = np.repeat(x, channels, axis=1)
    data = Dataset(np.ascontiguousarray(x, dtype=np.float32), bunch.target.astype(np.int64), 10, "digits")
    return data.split(val_fraction, seed)


def synthetic(
    n: int = 1024,
    input_shape: tuple[int, int, int] = (3, 32, 32),
    num_classes: int = 10,
    seed: int = 0,
    val_fraction: float = 0.2,
) -> tuple[Dataset, Dataset]:
    """Seeded images that are learnable: each class is a fixed random pattern plus noise."""
    shape = tuple(int(d) for d in input_shape)
    _check_room("the synthetic dataset", (n + num_classes) * int(np.prod(shape, dtype=object)) * 4)
    rng = np.random.default_rng(seed)
    patterns = rng.standard_normal((num_classes,) + shape).astype(np.float32)
    y = rng.integers(0, num_classes, n)
    x = np.empty((n,) + shape, np.float32)
    # drawn a slice at a time (the same values as one draw): Ctrl-C stops it between slices
    step = max(1, (1 << 22) // max(1, int(np.prod(shape))))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        noise = rng.standard_normal((hi - lo,) + shape).astype(np.float32)
        noise *= 1.5
        np.add(patterns[y[lo:hi]], noise, out=x[lo:hi])
    data = Dataset(x, y.astype(np.int64), num_classes, "synthetic")
    return data.split(val_fraction, seed)


def _available_memory() -> int | None:
    """Bytes of memory this machine has free (Linux and macOS), or None where it cannot tell."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _check_room(what: str, nbytes: int) -> None:
    """A ValueError before ``what`` (``nbytes`` of arrays, and about as much again while it is made) is
    allocated where the machine does not have that much memory free."""
    free = _available_memory()
    if free is not None and 2 * nbytes > free:
        raise ValueError(
            f"{what} would take {format_bytes(2 * nbytes)} of memory to make, and this machine has "
            f"{format_bytes(free)} free; use a smaller image size or fewer samples"
        )


def reverse(
    n: int = 4096,
    seq_len: int = 8,
    vocab: int = 50,
    min_len: int | None = None,
    seed: int = 0,
    val_fraction: float = 0.2,
) -> tuple[Dataset, Dataset]:
    """Learn to reverse a random sequence (a translation task in small): each sample is a source of
    ``min_len`` to ``seq_len`` tokens (ids 2 .. vocab-1, padded with 0) followed by the target shifted right
    (1 begins it), as float32 ids (N, 2 * seq_len); the labels are the reversed source (N, seq_len), 0 where
    padded. Shaped for ``vmem.models.get("nmt_small")``; returns (train, val)."""
    if not isinstance(seq_len, int) or seq_len < 1 or not isinstance(vocab, int) or vocab < 3:
        raise ValueError(f"reverse: seq_len={seq_len!r} must be positive and vocab={vocab!r} at least 3")
    lo = seq_len if min_len is None else min_len
    if not 1 <= lo <= seq_len:
        raise ValueError(f"reverse: min_len={min_len!r} must be in [1, seq_len={seq_len}]")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo, seq_len + 1, n)
    src = rng.integers(2, vocab, (n, seq_len))
    src[np.arange(seq_len)[None, :] >= lengths[:, None]] = 0
    y = np.zeros_like(src)
    for i, length in enumerate(lengths):
        y[i, :length] = src[i, :length][::-1]
    tgt_in = np.concatenate([np.ones((n, 1), src.dtype), y[:, :-1]], axis=1)
    x = np.concatenate([src, tgt_in], axis=1).astype(np.float32)
    data = Dataset(x, y.astype(np.int64), vocab, "reverse")
    return data.split(val_fraction, seed)


def load(
    name: str, input_shape: tuple[int, int, int] | None = None, seed: int = 0, n: int = 1024
) -> tuple[Dataset, Dataset]:
    """A dataset by name, shaped for a model's ``input_shape`` (C, H, W): ``digits`` or ``synthetic``."""
    if name == "digits":
        c, h, _ = input_shape or (1, 8, 8)
        return digits(image_size=h, channels=c, seed=seed)
    if name == "synthetic":
        return synthetic(n=n, input_shape=input_shape or (3, 32, 32), seed=seed)
    if name == "reverse":
        shape = tuple(input_shape or (16,))
        if len(shape) != 1:
            raise ValueError(f"dataset 'reverse': token sequences take a one-number input shape (length,), not {shape}")
        length = int(shape[0])
        return reverse(seq_len=length // 2, seed=seed)
    raise ValueError(f"unknown dataset {name!r}; use 'digits', 'synthetic' or 'reverse'")
