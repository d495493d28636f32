"""vDNN's static policies: layer-wise allocation, offload of stashed feature maps, prefetch in backward.

``vdnn-all`` offloads every stashed feature map (every buffer some backward reads); ``vdnn-conv`` only
the inputs of convolution layers, the largest and the ones whose transfer hides behind the longest
compute. Both allocate layer by layer and release every buffer after its last use.

Prefetch follows vDNN (Rhu et al., 2016, Fig. 10): when the backward of layer m starts, the nearest
earlier layer whose offloaded feature maps are not yet back is prefetched, searching back no further
than the previous convolution layer, so that the copy overlaps m's backward; anything layer m needs and
that is not back yet is fetched on demand (the compute stream then waits).

``sync="layer"`` (the paper): at the end of the layer that last reads an offloaded buffer, the compute
stream waits for the copy, then the buffer is released. ``sync="event"``: the release is deferred to the
copy's event and compute never waits for an offload.

``codec=`` (``zvc``, ``ssdc``, ``fp16``/``fp10``/``fp8``, ``fixed8``/``fixed4``, ``patch2``) encodes each
offloaded buffer on its way to the host and decodes it on its way back, so the bus carries the encoded
bytes (``vdnn-all:codec=zvc`` is cDMA in software). Lossless codecs keep training bitwise identical.
With a ``fixed`` codec, buffers that hold a batch norm's output (or a ReLU of it) take their per-channel
range from its parameters, ``beta +- bn_sigmas * |gamma|`` (default 4; 0: from the data); see
:mod:`vmem.policies.ranges`.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..device.spec import DeviceSpec
from ..graph import Program
from ..graph.analysis import needs_grad, prefetch_after, prefetch_points
from .base import Policy, option, register, split_convolutions
from .plan import Plan, Stash
from .ranges import batchnorm_ranges, check_sigmas

if TYPE_CHECKING:
    from .base import Oracle
    from ..costs.model import CostModel

__all__ = ["VdnnAll", "VdnnConv", "prefetch_points", "offload_codec", "check_density"]

SYNC_MODES = ("layer", "event")


def offload_codec(policy: str, spec: str) -> Any:
    """The codec named by a policy's ``codec=`` option, checked for offloading."""
    from .. import codecs

    try:
        codec = codecs.get(str(spec))
    except ValueError as exc:
        raise ValueError(f"policy {policy!r}: codec={spec!r}: {exc}") from None
    if codec.sign_only:
        raise ValueError(
            f"policy {policy!r}: codec={spec} keeps only the sign, which only ReLU's backward can "
            f"use; binarize through policy 'gist'"
        )
    return codec


def check_density(policy: str, density: float) -> None:
    if not isinstance(density, (int, float)) or not 0.0 <= density <= 1.0:
        raise ValueError(f"policy {policy!r}: density={density!r} must be a fraction in [0, 1]")


RELU_MODES = ("values", "bits")
PREFETCH_MODES = ("ahead", "after")
SIGN_MODES = ("device", "host")


@dataclass(frozen=True)
class _Vdnn(Policy):
    budget_free: ClassVar[bool] = True  # its decisions are the same at every capacity
    sync: str = "layer"
    codec: str | None = option(None)
    density: float = option(0.5)
    bn_sigmas: float = option(4.0)
    #: ``"bits"``: a stashed map only a ReLU's own backward reads (its sign) is kept on the device as 1-bit
    #: masks (Gist's binarize, 1/32 of FP32) instead of offloaded; ``"values"``: the paper's offload
    relu: str = option("values")
    #: ``"after"``: a lookahead prefetch is issued after the backward of the layer that would issue it (where
    #: that layer does not read it), not before; ``"ahead"``: the paper's
    prefetch: str = option("ahead")
    #: ``"host"``: the sign bits a split convolution (``split=on``) makes of its input for a later ReLU's
    #: backward wait in pinned host memory until that backward (``Plan.signs``), off the device while the
    #: convolution's backward-data holds dy + dx; ``"device"``: kept on the device
    signs: str = option("device")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sync not in SYNC_MODES:
            raise ValueError(f"policy {self.name!r}: sync={self.sync!r}; use one of {', '.join(SYNC_MODES)}")
        if self.relu not in RELU_MODES:
            raise ValueError(f"policy {self.name!r}: relu={self.relu!r}; use one of {', '.join(RELU_MODES)}")
        if self.prefetch not in PREFETCH_MODES:
            raise ValueError(
                f"policy {self.name!r}: prefetch={self.prefetch!r}; use one of {', '.join(PREFETCH_MODES)}"
            )
        if self.signs not in SIGN_MODES:
            raise ValueError(f"policy {self.name!r}: signs={self.signs!r}; use one of {', '.join(SIGN_MODES)}")
        if self.codec is not None:
            offload_codec(self.name, self.codec)
        check_density(self.name, self.density)
        check_sigmas(self.name, self.bn_sigmas)

    @abstractmethod
    def offloads(self, program: Program) -> set[int]:
        """Buffers (owner tensor ids) this policy offloads when they are stashed."""

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        stashed = program.stashed_buffers()
        bits = {b for b in stashed if program.sign_only(b)} if self.relu == "bits" else set()
        offloaded = (self.offloads(program) & stashed) - bits
        chosen = (
            {program.tensors[b].name: offload_codec(self.name, self.codec).spec for b in sorted(offloaded)}
            if self.codec
            else {}
        )
        chosen.update({program.tensors[b].name: "binarize" for b in sorted(bits)})
        points = prefetch_points(program, offloaded)
        if self.prefetch == "after":
            points = prefetch_after(program, points, needs_grad(program))

        def stash(b: int) -> Stash:
            return Stash.ENCODE if b in bits else Stash.OFFLOAD if b in offloaded else Stash.KEEP

        split = set(split_convolutions(program)) if self.split == "on" and self.signs == "host" else set()
        inputs = {program.tensors[op.inputs[0]].buffer for op in program.ops if op.name in split}
        signs = tuple(sorted(program.tensors[b].name for b in inputs))
        return self.new_plan(
            program,
            device,
            costs,
            signs=signs,
            stash={program.tensors[b].name: stash(b) for b in sorted(stashed)},
            prefetch=points,
            sync=self.sync,
            density=self.density,
            codecs=chosen,
            ranges=batchnorm_ranges(program, chosen, self.bn_sigmas),
            reason=f"layer-wise allocation; {self.name}: offload {len(offloaded)} of {len(stashed)} stashed buffers"
            + (f" through {self.codec}" if self.codec else "")
            + (f", {len(bits)} ReLU outputs kept as bits" if bits else ""),
        )


@register
@dataclass(frozen=True)
class VdnnAll(_Vdnn):
    """``vdnn-all[:algos=memory|performance,sync=layer|event]``: offload every stashed feature map."""

    name = "vdnn-all"

    def offloads(self, program: Program) -> set[int]:
        return program.stashed_buffers()


@register
@dataclass(frozen=True)
class VdnnConv(_Vdnn):
    """``vdnn-conv[:algos=memory|performance,sync=layer|event]``: offload only convolution inputs."""

    name = "vdnn-conv"

    def offloads(self, program: Program) -> set[int]:
        return {program.tensors[i].buffer for op in program.ops if op.kind == "conv" for i in op.inputs}
