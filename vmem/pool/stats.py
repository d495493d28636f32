"""Plain-data statistics and snapshots of the pools (dataclasses and TypedDicts, JSON-ready)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, TypedDict

__all__ = ["CATEGORIES", "CategoryStats", "PoolStats", "BlockInfo", "Snapshot", "check_category"]

#: Every byte the device pool hands out belongs to one of these (docs/architecture.md, memory accounting).
CATEGORIES: tuple[str, ...] = (
    "weights",
    "weight_grads",
    "optimizer_state",
    "feature_maps",
    "gradient_maps",
    "workspace",
    "encoded",
    "other",
)


def check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise ValueError(f"category={category!r} is not a memory category; use one of {', '.join(CATEGORIES)}")
    return category


@dataclass
class CategoryStats:
    """Bytes of one category: ``in_use`` now, ``peak`` since the last reset, live block ``count``."""

    in_use: int = 0
    peak: int = 0
    count: int = 0


@dataclass
class PoolStats:
    """A pool's state at one moment. Sizes are in bytes, after alignment.

    ``free`` is ``capacity - in_use``; ``largest_free`` the largest free block whoever may use it;
    ``pending`` the free bytes still owned by a stream or waiting on an event; ``fragmentation`` is
    ``1 - largest_free / free`` (0 when nothing is free). ``allocations`` and ``frees`` count successful
    calls since the pool was made (a failed request changes nothing here; ``pool.failures`` counts those).
    """

    capacity: int
    in_use: int
    peak: int
    free: int
    largest_free: int
    fragmentation: float
    pending: int
    count: int
    allocations: int
    frees: int
    by_category: dict[str, CategoryStats] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class BlockInfo(TypedDict):
    """One block of a snapshot.

    ``state`` is ``"allocated"`` or ``"free"``. For an allocated block, ``stream`` is the stream it was
    allocated on and ``requested`` the bytes asked for. For a free block, ``stream`` is the stream that
    owns it until its event completes (None: anyone may use it) and ``ready`` says whether every stream
    may take it now.
    """

    offset: int
    size: int
    state: Literal["allocated", "free"]
    category: str | None
    stream: str | None
    requested: int
    ready: bool


class Snapshot(TypedDict):
    """Every block of a pool in address order; they tile ``[0, capacity)`` exactly."""

    capacity: int
    alignment: int
    blocks: list[BlockInfo]
