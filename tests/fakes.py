"""Stand-in streams for tests: the runtime's own virtual streams, whose events complete only when a test
says so (a test injects what is upstream of the code it tests). ``advance(k)`` completes the next ``k`` items."""

from __future__ import annotations

from vmem.streams import VirtualEvent as FakeEvent
from vmem.streams import VirtualStream as FakeStream

__all__ = ["FakeEvent", "FakeStream", "WaitingStream"]


class WaitingStream(FakeStream):
    """A stand-in stream that remembers the events it was made to wait for."""

    def __init__(self, name: str):
        super().__init__(name)
        self.waits: list[FakeEvent] = []

    def wait(self, event: FakeEvent) -> float:
        self.waits.append(event)
        return super().wait(event)
