"""Device and pinned host memory pools: exact accounting, stream-ordered reuse, plain-data snapshots.

The pools know nothing of networks: they hand out aligned blocks of a fixed arena, keep statistics per
memory category, and reuse freed blocks in stream order.
"""

from ._bestfit import Block
from .arena import Arena, HostArena
from .pools import DevicePool, PinnedHostPool, PoolHook
from .stats import CATEGORIES, BlockInfo, CategoryStats, PoolStats, Snapshot

__all__ = [
    "DevicePool",
    "PinnedHostPool",
    "PoolHook",
    "Block",
    "Arena",
    "HostArena",
    "CATEGORIES",
    "CategoryStats",
    "PoolStats",
    "BlockInfo",
    "Snapshot",
]
