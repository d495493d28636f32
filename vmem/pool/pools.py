"""DevicePool, the caching device allocator, and PinnedHostPool, the reserved host buffers for offload.

Both carve aligned blocks out of one fixed arena with best fit, split and coalescing
(:mod:`vmem.pool._bestfit`), keep exact statistics per memory category, and raise a
:class:`~vmem.errors.MemoryExhausted` error that leaves the pool as it was.

Stream ordering lives here and nowhere else. ``DevicePool.allocate(n, stream=T)`` looks, in order:

1. for the best fit among free blocks anyone may use and blocks last freed on ``T`` itself (``T``'s
   later work is ordered after the free, so no wait is needed);
2. then hands back blocks freed on other streams whose free-time events have completed, coalesces
   them, and looks again;
3. then merges free blocks anyone may use into adjacent blocks of ``T`` (safe, and independent of
   timing, so the executor's placement matches the planner's replay) and looks again;
4. then blocks the host on the remaining free-time events, hands those blocks back, and looks again;
5. then raises :class:`~vmem.errors.OutOfDeviceMemory` with the pool unchanged.

Blocks of ``T`` itself are never handed back in step 2: whether their events have completed depends on
timing, and ``T`` can use them anyway.

A planned place (``offset=``, a planner's packing) comes first: taken at once where it is free for
``T``; where it covers memory another stream freed, ``T`` is made to wait for those frees' events (the
host does not wait: ``T``'s later work runs after the other stream's), or, for the host (no stream), the
host waits for them. This does not depend on timing, so the executor's blocks land where the plan's
replay put them.

So a block freed on one stream is never handed to another stream before the event recorded at its
free has completed, or before that stream has been made to wait for it. The pinned pool follows the
same chain, with the event of the copy that used a buffer in place of a stream.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeGuard

from ..errors import MemoryExhausted, OutOfDeviceMemory, OutOfPinnedMemory
from ..units import format_bytes, parse_bytes
from ._bestfit import ALLOCATED, RELEASED, BestFit, Block
from .arena import HostArena
from .stats import CATEGORIES, BlockInfo, CategoryStats, PoolStats, Snapshot

if TYPE_CHECKING:
    from .._typing import Array
    from numpy.typing import DTypeLike
    from ..streams.base import Event
    from ..streams.base import Stream

__all__ = ["DevicePool", "PinnedHostPool", "PoolHook", "Block"]


class PoolHook:
    """Observer of a pool (like CuPy's memory hooks). Override what you need.

    ``on_allocate(block)`` runs after a block is handed out; ``on_free(block, stream)`` runs before the
    block goes back to the free space (enqueue work on ``stream`` here and it is ordered before any reuse);
    ``on_failure(nbytes, category, error)`` runs before a failed request raises.
    """

    def on_allocate(self, block: Block) -> None:
        pass

    def on_free(self, block: Block, stream: Stream | None) -> None:
        pass

    def on_failure(self, nbytes: int, category: str, error: MemoryExhausted) -> None:
        pass


def _stream_name(stream: Stream | None) -> str | None:
    return None if stream is None else getattr(stream, "name", repr(stream))


class _ArenaPool:
    """Statistics, snapshots, hooks and the allocation fallback chain shared by both pools."""

    _error: type[MemoryExhausted] = MemoryExhausted
    _remedy = "raise the pool's capacity, or free blocks before allocating more"

    def __init__(self, capacity: int | str, alignment: int, upstream: Any, name: str):
        capacity = parse_bytes(capacity, name="capacity")
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment={alignment!r}: must be a positive power of two")
        capacity -= capacity % alignment
        if capacity <= 0:
            raise ValueError(f"capacity is smaller than one aligned block ({alignment} bytes)")
        self.name = name
        self.capacity = capacity
        self.alignment = alignment
        self._mask = alignment - 1
        #: the memory blocks are carved from (None for a pool that only plans: a simulated device's)
        self.arena: Any = upstream(capacity) if upstream is not None else None
        self._fit = BestFit(capacity)
        self._live: dict[int, Block] = {}  # offset -> allocated block: only this pool's own are freed
        self._lock = threading.RLock()
        self._hooks: list[PoolHook] = []
        self._in_use = 0
        self._peak = 0
        self._count = 0
        self._allocations = 0
        self._frees = 0
        self._failures = 0
        # category -> [in_use, peak, count]; a list, not a dataclass, because this is the hot path
        self._cat: dict[str, list[int]] = {c: [0, 0, 0] for c in CATEGORIES}

    # -- allocation --------------------------------------------------------------------------------
    def _allocate(
        self, nbytes: int, owner: Stream | None, category: str, high: bool = False, offset: int | None = None
    ) -> Block:
        if type(nbytes) is not int:
            if not hasattr(nbytes, "__index__") or isinstance(nbytes, bool):
                raise TypeError(f"nbytes must be an integer, not {type(nbytes).__name__}")
            nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"nbytes={nbytes}: cannot allocate a negative size")
        cat = self._cat.get(category)
        if cat is None:
            raise ValueError(f"category={category!r} is not a memory category; use one of {', '.join(CATEGORIES)}")
        size = (nbytes + self._mask) & ~self._mask or self.alignment
        with self._lock:
            fit = self._fit
            block = None
            if offset is not None:  # a planned place; if it is not free, fall back to best fit
                if offset % self.alignment:
                    raise ValueError(f"offset={offset}: must be a multiple of the alignment ({self.alignment})")
                block = fit.take_at(offset, size, owner)
                if block is None and fit.owners():  # other streams' frees there
                    if _is_stream(owner):  # the stream waits for them (stream-ordered), not the host
                        block = fit.take_at(offset, size, owner, order=owner.wait)
                    else:  # the host waits only for those there
                        fit.reclaim(wait=True, skip=owner, within=(offset, offset + size))
                        block = fit.take_at(offset, size, owner)
            if block is None:
                block = fit.take(size, owner, high)
            if block is None and size <= self.capacity - self._in_use:
                if fit.reclaim(skip=owner):  # 2. blocks of other streams whose events have completed
                    block = fit.take(size, owner, high)
                if block is None and fit.absorb(owner):  # 3. grow this stream's blocks into free neighbours
                    block = fit.take(size, owner, high)
                if block is None and fit.owners():  # 4. wait for the remaining events
                    fit.reclaim(wait=True)
                    block = fit.take(size, owner, high)
            if block is None:  # 5. the pool is unchanged
                self._failures += 1
                error = self._exhausted(size)
                for hook in self._hooks:
                    hook.on_failure(nbytes, category, error)
                raise error
            block.nbytes = nbytes
            block.category = category
            block.stream = owner
            self._live[block.offset] = block
            in_use = self._in_use = self._in_use + size
            if in_use > self._peak:
                self._peak = in_use
            self._count += 1
            self._allocations += 1
            cat[0] += size
            cat[2] += 1
            if cat[0] > cat[1]:
                cat[1] = cat[0]
            for hook in self._hooks:
                hook.on_allocate(block)
            return block

    def _release(
        self, block: Block, stream: Stream | None, owner: object, event: Event | Callable[[], Event] | None
    ) -> None:
        """Return ``block``; ``event`` is an event or a callable making one, called after the hooks ran
        (so that work a hook enqueues on ``stream``, such as poisoning, is ordered before the event)."""
        if not isinstance(block, Block):
            raise TypeError(f"{self.name} pool: free() takes a Block from allocate(), not {type(block).__name__}")
        with self._lock:
            if block.state != ALLOCATED:
                what = "was already freed" if block.state == RELEASED else "is not an allocated block"
                raise ValueError(f"{self.name} pool: {block!r} {what}")
            if self._live.get(block.offset) is not block:
                raise ValueError(f"{self.name} pool: {block!r} is not a block of this pool")
            del self._live[block.offset]
            for hook in self._hooks:
                hook.on_free(block, stream)
            if callable(event):
                event = event()
            size = block.size
            cat = self._cat[block.category]  # type: ignore[index]
            cat[0] -= size
            cat[2] -= 1
            self._in_use -= size
            self._count -= 1
            self._frees += 1
            self._fit.give(block, owner, event)

    def _exhausted(self, size: int) -> MemoryExhausted:
        free = self.capacity - self._in_use
        largest = self._fit.largest_free()
        if size > self.capacity:
            remedy = f"the request alone exceeds the capacity of {format_bytes(self.capacity)}; " + self._remedy
        elif size <= free:
            remedy = (
                f"{format_bytes(free)} are free but no single block is large enough (fragmentation); "
                "allocate large long-lived blocks first, or " + self._remedy
            )
        else:
            remedy = self._remedy
        return self._error(
            size,
            self.capacity,
            self._in_use,
            largest,
            1.0 - largest / free if free else 0.0,
            {c: v[0] for c, v in self._cat.items() if v[0]},
            pending=self._fit.free_bytes(owned_only=True),
            remedy=remedy,
        )

    # -- observation -------------------------------------------------------------------------------
    def stats(self) -> PoolStats:
        """Exact statistics now (a fresh dataclass; see :class:`~vmem.pool.PoolStats`)."""
        with self._lock:
            free = self.capacity - self._in_use
            largest = self._fit.largest_free()
            return PoolStats(
                capacity=self.capacity,
                in_use=self._in_use,
                peak=self._peak,
                free=free,
                largest_free=largest,
                fragmentation=1.0 - largest / free if free else 0.0,
                pending=self._fit.free_bytes(owned_only=True),
                count=self._count,
                allocations=self._allocations,
                frees=self._frees,
                by_category={c: CategoryStats(*v) for c, v in self._cat.items()},
            )

    def usage(self) -> dict[str, int]:
        """Bytes in use per category now (cheap: for timelines sampled at every op)."""
        return {c: v[0] for c, v in self._cat.items() if v[0]}

    @property
    def in_use(self) -> int:
        """Bytes held by live blocks (after alignment)."""
        return self._in_use

    @property
    def peak(self) -> int:
        """Largest ``in_use`` since the pool was made or :meth:`reset_peak` was called."""
        return self._peak

    def snapshot(self) -> Snapshot:
        """Every block in address order, as plain data (see :class:`~vmem.pool.Snapshot`)."""
        with self._lock:
            blocks: list[BlockInfo] = []
            for seg in self._fit.segments():
                if seg.state == ALLOCATED:
                    blocks.append(
                        BlockInfo(
                            offset=seg.offset,
                            size=seg.size,
                            state="allocated",
                            category=seg.category,
                            stream=_stream_name(seg.stream),
                            requested=seg.nbytes,
                            ready=False,
                        )
                    )
                else:
                    ready = seg.owner is None or (seg.event is not None and seg.event.query())
                    owner = seg.owner if _is_stream(seg.owner) else None
                    blocks.append(
                        BlockInfo(
                            offset=seg.offset,
                            size=seg.size,
                            state="free",
                            category=None,
                            stream=_stream_name(owner),
                            requested=0,
                            ready=ready,
                        )
                    )
            return Snapshot(capacity=self.capacity, alignment=self.alignment, blocks=blocks)

    def blocks(self, state: str = "allocated") -> list[Block]:
        """Live block handles (``state="allocated"``) in address order."""
        with self._lock:
            return [seg for seg in self._fit.segments() if seg.state == state]

    @property
    def failures(self) -> int:
        """Number of requests that raised because no block fitted."""
        return self._failures

    def reset_peak(self) -> None:
        """Set the pool-wide and per-category peaks to the current usage."""
        with self._lock:
            self._peak = self._in_use
            for v in self._cat.values():
                v[1] = v[0]

    def reclaim(self, *, wait: bool = False) -> int:
        """Hand free blocks whose events completed to every stream and coalesce them; return the bytes.

        With ``wait=True`` the host first waits for every pending event, so all free space ends up in
        as few blocks as the live blocks allow (one block when nothing is allocated).
        """
        with self._lock:
            return self._fit.reclaim(wait=wait)

    def add_hook(self, hook: PoolHook) -> None:
        self._hooks.append(hook)

    def remove_hook(self, hook: PoolHook) -> None:
        self._hooks.remove(hook)

    # -- arrays ------------------------------------------------------------------------------------
    def view(self, block: Block, shape: Iterable[int] | int, dtype: DTypeLike) -> Array:
        """An array of ``shape`` and ``dtype`` over ``block``'s memory in the arena."""
        import numpy as np

        if self.arena is None:
            raise RuntimeError(f"{self.name} pool has no backing memory (a simulated device holds no data)")
        if block.state != ALLOCATED:
            raise ValueError(f"{self.name} pool: cannot view {block!r}: it is not allocated")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes > block.size:
            raise ValueError(
                f"{self.name} pool: a {shape} {np.dtype(dtype).name} view needs {nbytes} bytes, "
                f"the block holds {block.size}"
            )
        return self.arena.view(block.offset, shape, dtype)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={format_bytes(self.capacity)}, in_use={format_bytes(self._in_use)}, "
            f"peak={format_bytes(self._peak)}, blocks={self._count})"
        )


def _is_stream(owner: object) -> TypeGuard[Stream]:
    return owner is not None and hasattr(owner, "record") and hasattr(owner, "launch")


class DevicePool(_ArenaPool):
    """A caching, stream-ordered allocator over one fixed device arena.

    ``capacity`` (bytes or a size string such as ``"512MiB"``) is never exceeded. Blocks are aligned to
    ``alignment`` bytes (a power of two) and rounded up to it. ``upstream(capacity)`` creates the arena
    (a :class:`~vmem.pool.HostArena` on the CPU device, a cudaMalloc'd slab on CUDA); with None the pool
    does offset arithmetic only, as the simulator needs. See the module docstring for the stream rules.
    """

    _error = OutOfDeviceMemory
    _remedy = "give the device more memory (memory=...), or use a policy that offloads or frees feature maps"

    def __init__(self, capacity: int | str, alignment: int = 256, upstream: Any = None, *, name: str = "device"):
        super().__init__(capacity, alignment, upstream, name)

    def allocate(
        self,
        nbytes: int,
        stream: Stream | None = None,
        category: str = "other",
        *,
        high: bool = False,
        offset: int | None = None,
    ) -> Block:
        """Allocate ``nbytes`` for work on ``stream`` (None: the host) and account it to ``category``.

        ``high=True`` carves the block from the high end of the best-fitting free block: a placement
        hint that keeps long-lived small blocks (saved state, labels) out of the way of the large
        short-lived ones, which otherwise fragment around them. ``offset``: place the block exactly there
        (a planner's packing; it must be free, else the pool falls back to best fit). There, memory
        another stream freed whose work may still run is taken in stream order: ``stream`` waits for that
        free's event (the host does not); for the host (``stream=None``) the host waits.
        Raises :class:`~vmem.errors.OutOfDeviceMemory` if no block fits; the pool is then unchanged.
        """
        return self._allocate(nbytes, stream, category, high, offset)

    def free(self, block: Block, stream: Stream | None = None) -> None:
        """Return ``block``; ``stream`` is the stream whose enqueued work last uses it.

        With ``stream=None`` the block's allocation stream is assumed. On that stream the block can be
        reused at once (later work is ordered after the free); other streams get it only after an event
        recorded on it now has completed. A block freed with no stream at all is free for everyone.
        """
        if stream is None:
            stream = getattr(block, "stream", None)
        if stream is not None and stream.closed:  # a closed stream has finished its work: free for everyone
            stream = None
        self._release(block, stream, stream, stream.record if stream is not None else None)


class PinnedHostPool(_ArenaPool):
    """Exact-size, reusable host buffers for offload, reserved up front.

    The whole ``capacity`` is reserved when the pool is made (cudaHostAlloc on CUDA; a prefaulted NumPy
    buffer on the CPU), so no pinned allocation ever happens inside a training step. A buffer returned
    with ``free(block, event)`` becomes reusable only after ``event`` (recorded after the copy that uses
    it) has completed. Raises :class:`~vmem.errors.OutOfPinnedMemory` when exhausted.
    """

    _error = OutOfPinnedMemory
    _remedy = "reserve a larger pinned pool (pinned_memory=...), or offload fewer or smaller (encoded) tensors"

    def __init__(
        self,
        capacity: int | str,
        alignment: int = 256,
        upstream: Any = None,
        *,
        name: str = "pinned",
        prefault: bool = True,
    ):
        if upstream is None:

            def upstream(n: int) -> HostArena:
                return HostArena(n, prefault=prefault)

        super().__init__(capacity, alignment, upstream, name)

    def allocate(self, nbytes: int, category: str = "feature_maps", *, high: bool = False) -> Block:
        """Take a buffer of ``nbytes`` (accounted to ``category``: what is offloaded into it); ``high``: from
        the top of the arena (a buffer held for the whole step, out of the way of the offloads' exact fit)."""
        return self._allocate(nbytes, None, category, high=high)

    def stats(self) -> PoolStats:
        """As for any pool; buffers whose copy has completed are handed back first, so ``pending`` counts
        exactly the buffers still waiting on their copy, as the snapshot shows them."""
        with self._lock:
            self._fit.reclaim()
            return super().stats()

    def require_idle(self, nbytes: int) -> None:
        """Before this pool is replaced by one of ``nbytes``: wait for pending returns, then raise
        OutOfPinnedMemory (with the pool unchanged) if buffers are still taken."""
        self.reclaim(wait=True)
        if self.in_use:
            stats = self.stats()
            raise OutOfPinnedMemory(
                nbytes,
                self.capacity,
                stats.in_use,
                stats.largest_free,
                stats.fragmentation,
                {c: s.in_use for c, s in stats.by_category.items()},
            )

    def free(self, block: Block, event: Event | None = None) -> None:
        """Return ``block`` once ``event`` (the event after its last copy) completes; now if None."""
        if event is not None and event.query():
            event = None
        self._release(block, None, event, event)
