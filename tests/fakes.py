"""A fake stream whose events complete only when a test says so (STYLE.md 3: inject the upstream)."""

from __future__ import annotations


class FakeEvent:
    def __init__(self, stream: "FakeStream", seq: int):
        self.stream = stream
        self.seq = seq
        self.timing = False

    def query(self) -> bool:
        return self.stream.done >= self.seq

    def synchronize(self) -> None:
        # The host waited: the stream has reached this point.
        self.stream.done = max(self.stream.done, self.seq)
        self.stream.host_waits += 1


class FakeStream:
    """Counts work; nothing runs. ``advance(k)`` completes the next ``k`` items."""

    def __init__(self, name: str):
        self.name = name
        self.enqueued = 0
        self.done = 0
        self.host_waits = 0
        self.launched: list = []

    def launch(self, fn, *args, **kwargs) -> None:
        self.enqueued += 1
        self.launched.append((fn, args, kwargs))

    def record(self, event=None, *, timing=False) -> FakeEvent:
        # Recording at a free stands for "the work that used the block is still in flight".
        self.enqueued += 1
        return FakeEvent(self, self.enqueued)

    def advance(self, k: int | None = None) -> None:
        self.done = self.enqueued if k is None else min(self.enqueued, self.done + k)

    def wait(self, event) -> None:
        pass

    def query(self) -> bool:
        return self.done >= self.enqueued

    def synchronize(self) -> None:
        self.done = self.enqueued

    def close(self) -> None:
        pass
