"""The executor's offloads, prefetches and encodings (:class:`Transfers`, an object the
:class:`~vmem.runtime.executor.Executor` holds and hands those steps to).

Offload copies a buffer to pinned host memory on the memory stream once compute has written it for the
last time (through its codec if the step names one: only the encoded bytes cross the bus), while its
readers' forward runs; Release frees it after the last of them as the step's sync mode says (the compute
stream waits for the copy, or the block is freed on the memory stream). Prefetch copies it back (decoding)
into a newly allocated block;
the compute stream waits for that copy before the first backward that reads it. Encodings kept on the
device (Gist) are made on the compute stream into the blocks the plan placed; one whose size depends on
the data and exceeds its block (data denser than the plan assumed) is kept in host memory instead.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import codecs
from ..precision import dtype as _dtype
from ..codecs import transfer
from ..schedule import Key, Kind
from ..schedule.steps import BnRange, Decode, Encode, Offload, Prefetch, Release, WaitPrefetch
from .timeline import Span, Timeline

if TYPE_CHECKING:
    from .._typing import Array
    from ..device.base import Device
    from ..codecs.base import Encoded
    from ..streams.base import Event
    from ..streams.base import Stream
    from ..codecs.transfer import Pieces
    from ..pool._bestfit import Block
    from ..pool.pools import PinnedHostPool
    from .executor import _Run

_BYTE = np.dtype(np.uint8)

__all__ = ["Transfers", "timed", "span"]


def timed(timeline: Timeline, name: str, stream: str, kind: str, usage: dict[str, int], fn: Any, *args: Any) -> None:
    """Run ``fn`` (on a stream) and record its span there, with the pool usage at its enqueue."""
    start = time.perf_counter()
    fn(*args)
    timeline.record(Span(name, stream, kind, start, time.perf_counter(), sum(usage.values()), usage))


class _Offloaded:
    """A buffer sent to pinned host memory: where it is, its encoding there (if a codec is set, filled
    in by the memory stream), the bytes that crossed the bus, and the events of its copies."""

    __slots__ = ("host_block", "host", "done", "back", "enc", "moved")

    def __init__(self, host_block: Block, host: np.ndarray):
        self.host_block = host_block
        self.host = host
        self.done: Any = None  # event after the device-to-host copy
        self.back: Any = None  # event after the host-to-device copy
        self.enc: Encoded | Pieces | None = None
        self.moved = 0


class _Spilled:
    """A buffer whose encoding did not fit its planned block: its raw bytes, in (pageable) host memory."""

    __slots__ = ("host",)

    def __init__(self, host: np.ndarray):
        self.host = host


def span(
    asynchronous: bool, r: "_Run", stream: Stream, name: str, kind: str, usage: dict[str, int], fn: Any, *args: Any
) -> None:
    """Enqueue ``fn`` on ``stream`` as a span of the step's timeline (``r.timeline``). Where work runs on its
    stream's own host thread (the CPU device), the host's clock times it there; where it runs after
    ``launch`` returns (``asynchronous``: a GPU), timing events before and after it do, read when the step
    has ended."""
    if r.graphed:  # a CUDA graph's capture: no timing event in it (CUDA cannot time captured events)
        stream.launch(fn, *args)
    elif asynchronous:
        start = stream.record(timing=True)
        stream.launch(fn, *args)
        r.timeline.pending(name, stream.name, kind, usage, start, stream.record(timing=True))
    else:
        stream.launch(timed, r.timeline, name, stream.name, kind, usage, fn, *args)


class Transfers:
    """Offload, prefetch, encode and decode steps on ``device``, for an executor that gives it what it reads:
    the ops' parameters (``op_params``, for a fixed-point codec's batch-norm range), how it views a block
    (``block_view(block, shape, dtype)``) and a buffer of the step (``view(r, key, shape, dtype)``), and how it
    runs work on the compute stream as a span (``launch(r, name, fn, *args, kind=)``); ``r`` is the step's
    state."""

    def __init__(
        self,
        device: Device,
        op_params: list[dict[str, Any]],
        block_view: Callable[[Any, tuple, Any], Any],
        view: Callable[[Any, Key, tuple, Any], Any],
        launch: Callable[..., None],
    ):
        self.device, self.xp = device, device.xp
        self.op_params, self.block_view, self.view, self.launch = op_params, block_view, view, launch
        #: work runs after launch returns (a GPU): spans are timed by events, streams wait on the device
        self.asynchronous = bool(device.asynchronous)

    @property
    def pinned(self) -> PinnedHostPool:
        """The device's pinned host pool (a device that runs steps has one)."""
        assert self.device.pinned is not None, f"{self.device.name} has no pinned host memory"
        return self.device.pinned

    def _span(
        self, r: "_Run", stream: Stream, name: str, kind: str, usage: dict[str, int], fn: Any, *args: Any
    ) -> None:
        span(self.asynchronous, r, stream, name, kind, usage, fn, *args)

    def begin(self, r: "_Run") -> None:
        r.offloaded = {}  # key -> _Offloaded, until its wait
        r.sent = []  # every offload of the step
        r.encodings = {}  # encoded buffer's key -> its Encoded (arrays in its block)

    def moved(self, r: "_Run") -> int:
        return sum(off.moved for off in r.sent)

    def release_all(self, r: "_Run") -> None:
        for off in r.offloaded.values():
            if off.back is None:  # still only on the host (a prefetched buffer's host copy is already returned)
                self.pinned.free(off.host_block, off.done)

    def _stall(self, r: "_Run", name: str, event: Event) -> None:
        """The compute stream waits for a memory-stream event; the wait is recorded as a stall. On an
        asynchronous device (a GPU) the stream waits, not the host, and timing events measure the wait."""
        cs = self.device.compute_stream
        if r.graphed:
            cs.wait(event)
            return
        if self.asynchronous:
            start = cs.record(timing=True)
            cs.wait(event)
            r.timeline.pending(name, cs.name, "wait", self.device.pool.usage(), start, cs.record(timing=True))
            return
        self.launch(r, name, event.synchronize, kind="wait")

    def _range(self, bn: BnRange | None) -> tuple[Any, Any] | None:
        """Per-channel (lo, hi) of a fixed-point buffer that follows a batch norm: beta +- sigmas * |gamma|,
        clamped at 0 after a ReLU (read when the encoding runs: after the forward, before the update)."""
        if bn is None:
            return None
        xp, p = self.xp, self.op_params[bn.op]
        half = xp.abs(p["weight"]) * p["weight"].dtype.type(bn.sigmas)
        lo, hi = p["bias"] - half, p["bias"] + half
        return (xp.maximum(lo, 0), xp.maximum(hi, 0)) if bn.relu else (lo, hi)

    # -- offload -----------------------------------------------------------------------------------
    def offload(self, r: "_Run", st: Offload) -> None:
        dev = self.device
        cs, ms = dev.compute_stream, dev.memory_stream
        block = r.blocks[st.key]  # stays allocated (read-only) until its Release
        host_block = self.pinned.allocate(st.host_nbytes, "feature_maps")
        off = _Offloaded(host_block, dev.host_view(host_block, (host_block.nbytes,), np.uint8))
        ms.wait(cs.record())
        name = f"offload:{st.key}"
        if st.codec is not None:
            src = self.block_view(block, st.shape, _dtype(st.dtype))
            self._span(r, ms, name, "offload", {}, self._send, st, src, off)
        else:
            off.moved = block.nbytes
            self._span(
                r,
                ms,
                name,
                "offload",
                {},
                dev.copy_now,
                off.host[: block.nbytes],
                self.block_view(block, (block.nbytes,), _BYTE),
                "d2h",
            )
        off.done = ms.record()
        r.offloaded[st.key] = off
        r.sent.append(off)

    def release(self, r: "_Run", st: Release) -> None:
        dev = self.device
        block = r.blocks.pop(st.key)
        if st.sync == "event":
            # freed in the memory stream's order, after the copy and after the readers (compute) are done
            dev.memory_stream.wait(dev.compute_stream.record())
            dev.pool.free(block, dev.memory_stream)
        else:
            self._stall(r, f"sync:{st.key}", r.offloaded[st.key].done)
            dev.pool.free(block, dev.compute_stream)

    def _send(self, st: Offload, src: Array, off: _Offloaded) -> None:
        assert st.codec is not None  # an offload through a codec
        off.enc = transfer.send(self.device, st.codec, src, off.host, self._range(st.range))
        off.moved = off.enc.nbytes

    def prefetch(self, r: "_Run", st: Prefetch) -> None:
        dev = self.device
        cs, ms = dev.compute_stream, dev.memory_stream
        off = r.offloaded[st.key]
        block = r.blocks[st.key]
        ms.wait(cs.record())  # the block's previous users on compute are done
        name = f"prefetch:{st.key}"
        if st.codec is not None:
            # off.enc is set by the offload's task: read it when this runs
            dst = self.block_view(block, st.shape, _dtype(st.dtype))
            codec = st.codec
            self._span(r, ms, name, "prefetch", {}, lambda: transfer.receive(dev, codec, off.enc, dst))
        else:
            raw = self.block_view(block, (block.nbytes,), _BYTE)
            encodings, key = r.encodings, st.key

            def copy() -> None:
                dev.copy_now(raw, off.host[: block.nbytes], "h2d")
                if key.kind is Kind.ENCODED:  # an encoding sent whole (a sign's bits): read from its new block
                    encodings[key] = encodings[key].at(raw)

            self._span(r, ms, name, "prefetch", {}, copy)
        off.back = ms.record()
        self.pinned.free(off.host_block, off.back)

    def wait_prefetch(self, r: "_Run", st: WaitPrefetch) -> None:
        self._stall(r, f"wait:{st.key}", r.offloaded.pop(st.key).back)  # back on the device for good

    # -- encodings kept on the device (Gist) ----------------------------------------------------------
    def encode(self, r: "_Run", st: Encode) -> None:
        """Encode a buffer into its encoding's block after its last forward use. An encoding whose size
        depends on the data (ssdc, zvc) and comes out larger than the block the plan sized at its density is
        not stored there: the buffer's bytes go to host memory instead (spilled) and come back at its
        Decode, so the device never holds more than the plan, at the places the plan chose."""
        src = self.block_view(r.blocks[st.key], st.shape, _dtype(st.dtype))
        raw = self.view(r, st.enc, (r.blocks[st.enc].nbytes,), np.uint8)
        flat = self.block_view(r.blocks[st.key], (st.nbytes,), _BYTE)
        encodings, codec, bn, dev, spilled = r.encodings, st.codec, st.range, self.device, r.spilled

        def run() -> None:
            ranged = self._range(bn)
            made = None if ranged else codec.encode_into(src, raw)  # in its block, where the codec can
            if made is not None:
                encodings[st.enc] = made
                return
            enc = codecs.encode_channels_last(codec, src, *(ranged or ()))
            if enc.stored_nbytes <= raw.nbytes:  # always, where the size does not depend on the data
                encodings[st.enc] = enc.store(raw)
                return
            host = np.empty(st.nbytes, np.uint8)  # rare, and not pinned: no pinned allocation inside a step
            dev.copy_now(host, flat, "d2h")
            encodings[st.enc] = _Spilled(host)
            spilled.append((str(st.key), enc.stored_nbytes, raw.nbytes))

        self.launch(r, f"encode:{st.key}", run)

    def decode(self, r: "_Run", st: Decode) -> None:
        """Decode a buffer back into its (newly allocated) block before the first backward that reads it
        (a spilled one: copied back from host memory)."""
        dst = self.block_view(r.blocks[st.key], st.shape, _dtype(st.dtype))
        flat = self.block_view(r.blocks[st.key], (st.nbytes,), _BYTE)
        encodings, codec, dev = r.encodings, st.codec, self.device

        def run() -> None:
            enc = encodings.pop(st.enc)
            if type(enc) is _Spilled:
                dev.copy_now(flat, enc.host, "h2d")
            else:
                codecs.decode_channels_last(codec, enc, dst)

        self.launch(r, f"decode:{st.key}", run)

    def relu_on_bits(self, r: "_Run", name: str, enc: Key, dy: Array, dx: Array) -> None:
        encodings = r.encodings
        self.launch(r, name, lambda: codecs.Binarize.relu_backward(encodings[enc], dy, dx))
