"""The Plan: what a policy decided for one network, batch and device. Decisions only; frozen plain data.

Decisions: the algorithm of every convolution pass, what happens to every stashed feature-map buffer
(named by the tensor that owns it: ``"keep"``, ``"offload"``, ``"encode"``, ``"recompute"``; a buffer no
backward reads may be kept or recomputed as the source of a rebuild), at which layer's backward each
offloaded buffer is prefetched (and, where its copy outlasts its readers, after which layer's forward its
block is released), which codec encodes an offloaded buffer on its way to the host (cDMA) or
an encoded buffer on the device until backward (Gist), the offload sync mode, and how memory is
allocated (``"network"``: everything up front, as Torch and Caffe do; ``"layer"``: layer by layer,
released after last use).

What a plan costs (peak and average bytes, bytes offloaded, step time, stalls, per-layer rows) is not
part of it: :func:`vmem.plan` lowers the plan to a schedule and replays it, and returns the plan with
those figures (:class:`vmem.planning.PlanResult`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from ..errors import PlanError

__all__ = ["Plan", "Stash", "Allocation"]


class _Decision(str, Enum):
    """A decision: compares, prints and serializes as its value (``Stash.OFFLOAD == "offload"``)."""

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


class Stash(_Decision):
    """What happens to a stashed feature-map buffer between its last forward use and backward."""

    KEEP = "keep"  # stays on the device
    OFFLOAD = "offload"  # copied to pinned host memory (through its codec, if it has one), prefetched back
    ENCODE = "encode"  # kept on the device in its codec's encoding (Gist)
    RECOMPUTE = "recompute"  # freed, and rebuilt by running its producer again before backward reads it


class Allocation(_Decision):
    """How a step's memory is allocated."""

    NETWORK = "network"  # everything up front, as Torch and Caffe do
    LAYER = "layer"  # layer by layer, released after last use


@dataclass(frozen=True)
class Plan:
    policy: str
    network: str
    batch: int
    device: str
    capacity: int
    allocation: str  # an Allocation ("network" | "layer"; a string is taken)
    algos: dict[str, dict[str, str]] = field(default_factory=dict)  # op -> pass -> algorithm
    stash: dict[str, str] = field(default_factory=dict)  # stashed buffer (owner) -> a Stash (a string is taken)
    codecs: dict[str, str] = field(default_factory=dict)  # offloaded or encoded buffer -> codec spec
    #: fraction of nonzeros data-dependent encodings are sized for (gist's plans: 0.6, a margin above the
    #: half a ReLU after batch norm keeps)
    density: float = 0.5
    # fixed-point buffers whose per-channel range comes from a batch norm: buffer -> {"batchnorm": op name,
    # "relu": whether a ReLU follows it, "sigmas": half-width in standard deviations} (see policies.ranges)
    ranges: dict[str, dict[str, Any]] = field(default_factory=dict)
    prefetch: dict[str, list[str]] = field(default_factory=dict)  # op -> buffers to prefetch at its backward
    # offloaded buffer -> the op after whose forward its block is released, where that is later than its last
    # forward reader: a copy that outlasts the readers keeps its memory until it is expected to end, so that
    # the forward does not wait to reuse it (the memory is counted for that long)
    release: dict[str, str] = field(default_factory=dict)
    sync: str | None = None  # "layer" | "event" for offloading plans
    reason: str = ""
    chosen: str | None = None  # for a policy that chooses among others (vdnn-dyn): the one it chose
    step: int | None = None  # ... and the step of its procedure that chose it
    notes: dict[str, str] = field(default_factory=dict)  # buffer -> why the policy decided as it did (echo)
    #: how the device computes FP32 convolutions ("tf32" or "exact": ``DeviceSpec.math``), as the planner
    #: recorded it (a policy leaves it to the planner)
    math: str = "exact"
    #: convolutions whose backward runs as two steps, backward-filter then backward-data, their input freed
    #: between (where nothing later reads it): the layer's peak max(x + dy, dy + dx) instead of x + dy + dx
    split: tuple[str, ...] = ()
    #: inputs of split convolutions whose sign bits (made at the split for a later ReLU's backward) go to
    #: pinned host memory from the split until that backward instead of staying on the device: the bits are
    #: off the device while the convolution's backward-data holds dy + dx (named buffers the lowering makes
    #: no bits for are ignored)
    signs: tuple[str, ...] = ()
    #: the step runs as this many micro-batches of the batch, one after the other (the plan's decisions are
    #: each micro-batch's; :mod:`vmem.planning.microbatch`); 1: the whole batch at once
    microbatch: int = 1

    def __post_init__(self) -> None:
        """Decisions given as strings become :class:`Stash` and :class:`Allocation` members; an unknown one
        is a PlanError naming the buffer."""
        try:
            allocation = Allocation(self.allocation)
        except ValueError:
            raise PlanError(
                f"plan {self.policy!r}: allocation {self.allocation!r}; use one of "
                f"{', '.join(a.value for a in Allocation)}"
            ) from None
        stash = {}
        for buffer, decision in self.stash.items():
            try:
                stash[buffer] = Stash(decision)
            except ValueError:
                raise PlanError(
                    f"plan {self.policy!r}: buffer {buffer!r}: stash decision {decision!r}; use one of "
                    f"{', '.join(d.value for d in Stash)}"
                ) from None
        object.__setattr__(self, "allocation", allocation)
        object.__setattr__(self, "stash", stash)

    def decisions(self) -> tuple:
        """What the lowering reads of the plan, as one hashable value: two plans with equal decisions make
        the same schedule, whatever policy made them and why (the release mode only where something is
        offloaded)."""

        def frozen(mapping: dict) -> tuple:
            return tuple(
                sorted(
                    (k, frozen(v) if isinstance(v, dict) else tuple(v) if isinstance(v, list) else v)
                    for k, v in mapping.items()
                )
            )

        offloads = Stash.OFFLOAD in self.stash.values() or bool(self.signs)
        return (
            self.allocation,
            frozen(self.algos),
            frozen(self.stash),
            frozen(self.codecs),
            self.density,
            frozen(self.ranges),
            frozen(self.prefetch),
            frozen(self.release),
            self.sync if offloads else None,
            tuple(sorted(self.split)),
            tuple(sorted(self.signs)),
            self.microbatch,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["allocation"] = str(self.allocation)
        out["stash"] = {k: str(v) for k, v in self.stash.items()}
        return out
