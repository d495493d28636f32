"""Best-fit range allocator with split, coalescing and owner-tagged free blocks.

This is the offset arithmetic shared by :class:`~vmem.pool.DevicePool` and
:class:`~vmem.pool.PinnedHostPool`. It knows nothing of devices, categories or statistics.

The arena ``[0, capacity)`` is covered by a doubly linked list of contiguous :class:`Block` segments.
A free segment carries an ``owner`` and an ``event``:

* ``owner is None``: anyone may take it.
* ``owner`` is a stream: that stream may take it at once (its later work is ordered after the free);
  anyone else only once ``event`` (recorded on the owner at the free) has completed.
* ``owner`` is any other token (the pinned pool uses the copy's event itself): nobody may take it until
  ``event`` has completed.

Adjacent free segments merge only when they have the same owner, so a merge never makes memory
available earlier than the rules above allow. When a free segment's event completes, :meth:`reclaim`
hands it to ``owner=None`` and merges it with its free neighbours: once every event has completed, the
free space is fully coalesced.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any, Iterator, TYPE_CHECKING

if TYPE_CHECKING:
    from ..streams.base import Event
    from ..streams.base import Stream

__all__ = ["Block", "BestFit", "ALLOCATED", "FREE", "RELEASED"]

ALLOCATED = "allocated"
FREE = "free"
RELEASED = "released"  # a handle whose memory went back to the pool; using it again is an error


class Block:
    """A range ``[offset, offset + size)`` of an arena.

    Handles returned by ``allocate`` are Blocks in state ``"allocated"``; after ``free`` the handle is
    ``"released"`` and must not be used again. ``nbytes`` is what was asked for, ``size`` what is held
    (rounded up to the pool's alignment). ``stream`` is the stream the block was allocated on.
    """

    __slots__ = ("offset", "size", "nbytes", "category", "stream", "state", "owner", "event", "prev", "next")

    def __init__(self, offset: int, size: int):
        self.offset = offset
        self.size = size
        self.nbytes = size
        self.category: str | None = None
        self.stream: Stream | None = None
        self.state = FREE
        self.owner: object = None
        self.event: Event | None = None
        self.prev: Block | None = None
        self.next: Block | None = None

    @property
    def end(self) -> int:
        """One past the last byte of the block."""
        return self.offset + self.size

    def __repr__(self) -> str:
        extra = f", category={self.category!r}" if self.category else ""
        return f"Block(offset={self.offset}, size={self.size}, state={self.state!r}{extra})"


class BestFit:
    """Best-fit allocation of aligned ranges of ``[0, capacity)``; see the module docstring."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.head = Block(0, capacity)
        # owner -> sorted list of (size, offset) keys of its free segments
        self._lists: dict[Any, list[tuple[int, int]]] = {None: [(capacity, 0)]}
        self._free: dict[int, Block] = {0: self.head}  # free segments by offset

    # -- queries -----------------------------------------------------------------------------------
    def segments(self) -> Iterator[Block]:
        """Every segment, allocated or free, in address order."""
        seg: Block | None = self.head
        while seg is not None:
            yield seg
            seg = seg.next

    def largest_free(self) -> int:
        """Size of the largest free segment, whoever owns it."""
        return max((lst[-1][0] for lst in self._lists.values() if lst), default=0)

    def free_bytes(self, *, owned_only: bool = False) -> int:
        """Bytes in free segments (``owned_only``: only those not yet handed back to everyone)."""
        return sum(size for owner, lst in self._lists.items() if not (owned_only and owner is None) for size, _ in lst)

    def owners(self) -> list[Any]:
        """Owners (other than None) that hold free segments."""
        return [owner for owner, lst in self._lists.items() if owner is not None and lst]

    def pending_events(self) -> list[Any]:
        """Events that still gate owned free segments."""
        events: dict[int, Any] = {}
        for owner in self.owners():
            for _, offset in self._lists[owner]:
                event = self._free[offset].event
                if event is not None:
                    events[id(event)] = event
        return list(events.values())

    # -- allocation --------------------------------------------------------------------------------
    def take(self, size: int, owner: object = None, high: bool = False) -> Block | None:
        """Carve ``size`` bytes from the best-fitting free segment usable by ``owner``, or return None.

        Usable: segments owned by nobody, and, when ``owner`` is not None, segments owned by ``owner``.
        The block comes from the low end of the segment, or its high end with ``high=True`` (so that two
        kinds of blocks grow from opposite ends of free space instead of interleaving).
        The returned block is marked allocated; its other fields are the caller's to fill.
        """
        best_list: list[tuple[int, int]] | None = None
        best_index = -1
        best_key: tuple[int, int] = (0, 0)
        for key_owner in (None, owner) if owner is not None else (None,):
            lst = self._lists.get(key_owner)
            if not lst:
                continue
            i = bisect_left(lst, (size, -1))
            if i < len(lst) and (best_list is None or lst[i] < best_key):
                best_list, best_index, best_key = lst, i, lst[i]
        if best_list is None:
            return None
        del best_list[best_index]
        seg = self._free.pop(best_key[1])
        if seg.size == size:
            seg.state = ALLOCATED
            seg.owner = seg.event = None
            return seg
        # Split: the allocation takes one end, the remainder stays free with the same owner.
        if high:
            block = Block(seg.offset + seg.size - size, size)
            block.state = ALLOCATED
            block.prev = seg
            block.next = seg.next
            if seg.next is not None:
                seg.next.prev = block
            seg.next = block
            seg.size -= size
        else:
            block = Block(seg.offset, size)
            block.state = ALLOCATED
            block.prev = seg.prev
            block.next = seg
            if seg.prev is None:
                self.head = block
            else:
                seg.prev.next = block
            seg.prev = block
            seg.offset += size
            seg.size -= size
        self._free[seg.offset] = seg
        insort(best_list, (seg.size, seg.offset))
        return block

    def take_at(self, offset: int, size: int, owner: object = None, order: Any = None) -> Block | None:
        """Carve exactly ``[offset, offset + size)`` if free segments usable by ``owner`` (owned by nobody or
        by ``owner``) cover it, one or several side by side; the parts of the first and last outside the
        range stay free with their owner and event.

        ``order`` (a stream's ``wait``): segments other streams freed are usable too, each after
        ``order(event)`` of its pending free, so that the taker's later work runs after that free's."""
        end = offset + size
        first = None
        for c in self._free.values():  # a plain loop: few free segments, and this runs for every planned block
            if c.offset <= offset < c.offset + c.size:
                first = c
                break
        run: list[Block] = []
        seg = first
        while seg is not None and seg.state == FREE and (seg.owner is None or seg.owner is owner or order is not None):
            run.append(seg)
            if seg.end >= end:
                break
            seg = seg.next
        else:
            return None
        if order is not None:
            for part in run:
                if part.owner is not None and part.owner is not owner and part.event is not None:
                    if not part.event.query():
                        order(part.event)
        last = run[-1]
        for part in run:
            self._unlist(part)
        last_end, after, last_owner, last_event = last.end, last.next, last.owner, last.event
        seg = run[0]
        if seg.offset < offset:  # the part below stays free
            below = Block(seg.offset, offset - seg.offset)
            below.owner, below.event, below.state = seg.owner, seg.event, FREE
            below.prev, below.next = seg.prev, seg
            if seg.prev is None:
                self.head = below
            else:
                seg.prev.next = below
            seg.prev = below
            self._list(below)
        seg.offset, seg.size = offset, size
        if last_end > end:  # the part above stays free
            above = Block(end, last_end - end)
            above.owner, above.event, above.state = last_owner, last_event, FREE
            above.prev, above.next = seg, after
            if after is not None:
                after.prev = above
            self._list(above)
            after = above
        seg.next = after
        if after is not None:
            after.prev = seg
        seg.state = ALLOCATED
        seg.owner = seg.event = None
        return seg

    def _list(self, seg: Block) -> None:
        self._free[seg.offset] = seg
        lst = self._lists.get(seg.owner)
        if lst is None:
            lst = self._lists[seg.owner] = []
        insort(lst, (seg.size, seg.offset))

    def give(self, block: Block, owner: object = None, event: Event | None = None) -> None:
        """Return an allocated ``block`` to the free space, owned by ``owner`` until ``event`` completes.

        The handle ``block`` becomes ``"released"``; a new free segment takes its place (or its
        neighbours absorb it), so a stale handle can never alias memory handed out later.
        """
        seg = Block(block.offset, block.size)
        seg.prev, seg.next = block.prev, block.next
        if seg.prev is None:
            self.head = seg
        else:
            seg.prev.next = seg
        if seg.next is not None:
            seg.next.prev = seg
        block.state = RELEASED
        block.prev = block.next = None
        seg.owner = owner
        seg.event = event
        self._insert_merged(seg)

    def absorb(self, owner: object) -> bool:
        """Merge free segments anyone may use into adjacent free segments of ``owner``.

        Always safe (it only narrows who may use that memory until ``owner``'s event completes) and
        independent of timing; it gives ``owner`` larger blocks without waiting for anything.
        """
        merged = False
        lst = self._lists.get(owner)
        if owner is None or not lst:
            return False
        for key in list(lst):
            seg = self._free.get(key[1])
            if seg is None or seg.owner is not owner:
                continue
            # Extend seg over its free-for-all neighbours only: seg keeps its own event. (Merging on into
            # another segment of the same owner could lose that segment's later event.)
            for nb in (seg.prev, seg.next):
                if nb is None or nb.state != FREE or nb.owner is not None:
                    continue
                self._unlist(nb)
                self._unlist(seg)
                if nb is seg.prev:
                    seg.offset = nb.offset
                    seg.prev = nb.prev
                    if nb.prev is None:
                        self.head = seg
                    else:
                        nb.prev.next = seg
                else:
                    seg.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = seg
                seg.size += nb.size
                nb.prev = nb.next = None
                nb.state = RELEASED
                self._list(seg)
                merged = True
        return merged

    def reclaim(self, *, wait: bool = False, skip: Any = None, within: tuple[int, int] | None = None) -> int:
        """Hand owned free segments whose events completed to everyone; return the bytes reclaimed.

        With ``wait=True``, first block the host until every pending event completes, so that all free
        space ends up owned by nobody and fully coalesced; with ``within=(lo, hi)`` as well, wait only for
        the segments that overlap ``[lo, hi)`` (the others are handed over if their events completed).
        Segments of ``skip`` are left alone.
        """
        reclaimed = 0
        for owner in self.owners():
            if owner is skip and skip is not None:
                continue
            lst = self._lists[owner]
            for key in list(lst):
                seg = self._free[key[1]]
                event = seg.event
                if event is not None and not event.query():
                    if not wait or (within is not None and not (seg.offset < within[1] and within[0] < seg.end)):
                        continue
                    event.synchronize()
                lst.remove(key)
                del self._free[seg.offset]
                seg.owner = seg.event = None
                reclaimed += seg.size
                self._insert_merged(seg)
            if not lst:  # forget the owner, so a dead stream is not kept alive here
                del self._lists[owner]
        return reclaimed

    # -- internals ---------------------------------------------------------------------------------
    def _unlist(self, seg: Block) -> None:
        lst = self._lists[seg.owner]
        del lst[bisect_left(lst, (seg.size, seg.offset))]
        del self._free[seg.offset]

    def _insert_merged(self, seg: Block) -> None:
        """Mark ``seg`` free, merge it with same-owner free neighbours, and list the result."""
        seg.state = FREE
        owner = seg.owner
        prev = seg.prev
        if prev is not None and prev.state == FREE and prev.owner is owner:
            # prev absorbs seg; seg was just freed, so its event is the newer one on that stream and
            # gates both (callers insert only segments whose event is the newest of their owner's)
            self._unlist(prev)
            prev.size += seg.size
            prev.next = seg.next
            if seg.next is not None:
                seg.next.prev = prev
            if seg.event is not None:
                prev.event = seg.event
            seg.prev = seg.next = None
            seg.state = RELEASED
            seg = prev
        nxt = seg.next
        if nxt is not None and nxt.state == FREE and nxt.owner is owner:
            self._unlist(nxt)
            seg.size += nxt.size
            seg.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = seg
            if seg.event is None:
                seg.event = nxt.event
            nxt.prev = nxt.next = None
            nxt.state = RELEASED
        self._free[seg.offset] = seg
        lst = self._lists.get(owner)
        if lst is None:
            lst = self._lists[owner] = []
        insort(lst, (seg.size, seg.offset))
