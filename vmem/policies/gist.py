"""Gist (Jain et al., ISCA 2018): stashed feature maps are kept encoded on the device until backward.

Allocation is layer-wise, as in vDNN, but nothing leaves the device. After the last forward use of a
stashed buffer it is encoded into a smaller buffer (category ``encoded``) and released; just before the
first backward that reads it, it is decoded back (or, for binarized buffers, never decoded):

- ``binarize`` (lossless for training): a buffer that only sign-only backwards read (ReLU's output when
  the next layer is a max-pool, whose backward uses its own argmax map) is kept as 1 bit per value, and
  ReLU's backward runs on the bits.
- ``ssdc`` (lossless): a buffer of ReLU outputs (or max-pools of them) that a layer's backward reads as
  values (the input of a convolution) is kept as CSR with 1-byte column indices.
- ``dpr=fp16|fp10|fp8`` (lossy, delayed precision reduction): every other stashed buffer, and those
  ssdc would take, is kept in the reduced format; the forward pass still used full precision.
  ``codec=`` names any value codec instead (``fixed8``, ``fixed4``, ``patch2``, ``zvc``, ...; patch2
  applies to 4-D buffers only). With ``fixed``, buffers that hold a batch norm's output (or a ReLU of
  it) take their per-channel range from its parameters, ``beta +- bn_sigmas * |gamma|`` (default 4; 0:
  from the data; see :mod:`vmem.policies.ranges`).

``density`` (default 0.6) is the fraction of nonzeros the plan sizes data-dependent encodings (ssdc,
zvc) for: a margin above the half that a ReLU after a batch norm keeps (measured on vgg_cifar trained
on digits: up to 0.51). An encoding that comes out larger than its block is not stored: that buffer's
values wait in host memory until backward (see :class:`~vmem.schedule.steps.Encode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import codecs
from ..device.spec import DeviceSpec
from ..graph import Program
from ..graph.analysis import nonnegative_sparse
from .base import Policy, option, register
from .plan import Plan, Stash
from .ranges import batchnorm_ranges, check_sigmas
from .vdnn import check_density

if TYPE_CHECKING:
    from .base import Oracle
    from ..costs.model import CostModel

__all__ = ["Gist"]


@register
@dataclass(frozen=True)
class Gist(Policy):
    """``gist[:dpr=fp16|fp10|fp8,codec=...,binarize=true,ssdc=true,density=0.6,bn_sigmas=4,
    algos=memory|performance]``."""

    name = "gist"
    budget_free = True  # its decisions are the same at every capacity
    dpr: str | None = option(None)
    codec: str | None = option(None)
    binarize: bool = option(True)
    ssdc: bool = option(True)
    density: float = option(0.6)
    bn_sigmas: float = option(4.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_density(self.name, self.density)
        check_sigmas(self.name, self.bn_sigmas)
        if self.dpr is not None and self.dpr not in codecs.FORMATS:
            raise ValueError(f"policy 'gist': dpr={self.dpr!r}; use one of {', '.join(codecs.FORMATS)}")
        if self.dpr is not None and self.codec is not None:
            raise ValueError("policy 'gist': give dpr= or codec=, not both")
        if self.codec is not None:
            try:
                c = codecs.get(str(self.codec))
            except ValueError as exc:
                raise ValueError(f"policy 'gist': codec={self.codec!r}: {exc}") from None
            if c.sign_only:
                raise ValueError(
                    f"policy 'gist': codec={self.codec} keeps only signs; binarizing is applied where "
                    "it can be (binarize=true)"
                )
        for key in ("binarize", "ssdc"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"policy 'gist': {key}={getattr(self, key)!r} must be true or false")

    def _value_codec(self) -> Any:
        if self.dpr is not None:
            return codecs.get("dpr", format=self.dpr)
        return codecs.get(str(self.codec)) if self.codec is not None else None

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        tensors = program.tensors
        lossy = self._value_codec()
        stash: dict[str, str] = {}
        chosen: dict[str, str] = {}
        for b in sorted(program.stashed_buffers()):
            t = tensors[b]
            codec = None
            if self.binarize and program.sign_only(b):
                codec = codecs.get("binarize")
            elif lossy is not None and lossy.applies(t.shape):
                codec = lossy
            elif self.ssdc and nonnegative_sparse(program, b):
                codec = codecs.get("ssdc")
            stash[t.name] = Stash.ENCODE if codec is not None else Stash.KEEP
            if codec is not None:
                chosen[t.name] = codec.spec
        counts: dict[str, int] = {}
        for spec in chosen.values():
            counts[spec] = counts.get(spec, 0) + 1
        summary = ", ".join(f"{n} {spec}" for spec, n in sorted(counts.items())) or "nothing"
        return self.new_plan(
            program,
            device,
            costs,
            stash=stash,
            codecs=chosen,
            density=self.density,
            ranges=batchnorm_ranges(program, chosen, self.bn_sigmas),
            reason=f"layer-wise allocation; gist: encode {summary} of {len(stash)} stashed buffers on the device",
        )
