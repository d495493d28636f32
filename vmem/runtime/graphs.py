"""Training steps replayed as CUDA graphs (a device's ``graphs=True``): which steps, and when a replay is safe.

A planned schedule issues the same kernels, copies and fills at the same addresses every step (the plan
places each buffer where it placed it before). The executor runs a step that repeats the last one's key
(its batch's shapes, the loss scale, a micro-batch's share: what a graph bakes into its launches) under
the device's capture instead of running it, launches the graph, and from then on launches that graph alone
while the key repeats, the pools are as it left them (every block the graph uses is free) and the batch's
pinned staging buffer falls where it fell. Anything else runs the step as it is, and the next repeat is
captured again. What changes every step is not baked in: the batch and the optimizer's scalars (the
learning rate, Adam's bias correction) are written into the pinned staging buffer before each launch and
copied to the device by the graph itself.

What keeps a step out of a graph, said once per key in a :class:`RuntimeWarning`: a diagnosis (``check``),
an input already on the device (its address is the caller's), collectives (another library's streams),
inference; and whatever the capture itself refuses (the host reading a value inside the step, an upload
from pageable memory, a random draw on the host, an optimizer without a fused kernel): the capture is
dropped, none of its work ran, and the step runs as it is.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable

from ..device.base import Graph

if TYPE_CHECKING:
    from .._typing import Array
    from ..pool import DevicePool, PinnedHostPool

__all__ = ["Graph", "Recorded", "StepGraphs", "pool_state"]


def pool_state(pool: DevicePool | PinnedHostPool) -> tuple:
    """What must be as it was for a graph of ``pool``'s blocks to replay: where its memory is (a pool made
    anew may lie elsewhere) and its live blocks (every other byte is free)."""
    where = None if pool.arena is None else pool.arena.ptr
    return (where, pool.capacity, tuple((b.offset, b.size) for b in pool.blocks()))


@dataclass
class Recorded:
    """A captured step: its graph, the finite flag it writes, and what must hold for it to replay (the
    device and pinned pools' states and the staging buffer's place it left), with the step's measures."""

    key: Hashable
    graph: Graph
    ok: Array | None
    device_state: tuple
    pinned_state: tuple
    staged: int
    peak: int
    average: float
    moved: int


class StepGraphs:
    """The graphs of one executor's training steps (see the module docstring)."""

    def __init__(self, network: str):
        self.network = network
        self.recorded: Recorded | None = None
        self._last: Hashable | None = None  # the key of the last step run as it is
        self._measured: dict[Hashable, tuple[int, float]] = {}  # key -> the last such step's peak, average
        self._refused: dict[Hashable, str] = {}  # key -> why its capture failed
        self._said: set[str] = set()
        #: why the last step ran without a graph (None: it ran with one)
        self.reason: str | None = None

    def eligible(self, *, train: bool, check: bool, device_input: bool, collectives: bool) -> str | None:
        """Why a step with these traits cannot be a graph (None: it can)."""
        if not train:
            return "inference steps are not captured"
        if check:
            return "check=True looks at every op's output from the host"
        if device_input:
            return "the batch is already on the device (its address is the caller's)"
        if collectives:
            return "the step runs collectives (gradients, or batch norm's statistics, summed by the host's channel)"
        return None

    def replayable(self, key: Hashable, device_state: tuple, pinned_state: tuple) -> Recorded | None:
        """The recorded graph, where ``key`` is its step's and the pools are as it left them."""
        rec = self.recorded
        if rec is None or rec.key != key:
            return None
        if rec.device_state != device_state or rec.pinned_state != pinned_state:
            self.drop()  # its blocks may be someone else's now
            return None
        return rec

    def should_capture(self, key: Hashable) -> bool:
        """Whether this step is captured: its key repeats the last step's and its capture has not failed."""
        return key == self._last and key not in self._refused

    def ran_as_is(self, key: Hashable | None, reason: str | None, peak: int = 0, average: float = 0.0) -> None:
        """A step ran without a graph (``reason``, said once; None: it was the first of its key)."""
        self._last = key
        if key is not None:
            self._measured[key] = (peak, average)
        self.reason = reason or (self._refused.get(key) if key is not None else None) or "the first step of its kind"
        if reason is not None and reason not in self._said and not reason.startswith("inference"):
            self._said.add(reason)
            warnings.warn(
                f"{self.network}: graphs='on', but a step runs without a CUDA graph: {reason}",
                RuntimeWarning,
                stacklevel=4,
            )

    def refuse(self, key: Hashable, error: BaseException) -> str:
        reason = f"its capture failed ({type(error).__name__}: {error})"
        self._refused[key] = reason
        return reason

    def measured(self, key: Hashable) -> tuple[int, float] | None:
        return self._measured.get(key)

    def keep(self, rec: Recorded) -> None:
        self.drop()
        self.recorded = rec
        self._last = rec.key
        self.reason = None

    def drop(self) -> None:
        if self.recorded is not None:
            self.recorded.graph.close()
            self.recorded = None

    def close(self) -> None:
        self.drop()
