"""Reports: a per-layer table joining a plan's decisions with a measured step's times."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from ..runtime.timeline import Timeline
from ..units import format_bytes

if TYPE_CHECKING:
    from .result import PlanResult
    from ..graph.program import Program

__all__ = ["layer_table"]


def layer_table(plan: PlanResult, timeline: Timeline | None = None) -> str:
    """Per layer of a planned step (a :class:`vmem.planning.PlanResult`): output shape, algorithms, stash
    decision, bytes, and (with a timeline) forward and backward milliseconds measured on the compute
    stream."""
    times: dict[str, float] = {}
    if timeline is not None:
        for s in timeline.spans:
            if s.stream == "compute" and s.kind == "compute":
                times[s.name] = times.get(s.name, 0.0) + s.seconds
    head = (
        "layer",
        "output",
        "algorithms (fwd/bwd-data/bwd-filter)",
        "stash",
        "bytes",
        "workspace",
        "fwd ms",
        "bwd ms",
    )
    rows: list[tuple[Any, ...]] = [head]
    for row in plan.layers:
        fwd = times.get(row.name)
        bwd = times.get(f"{row.name}.backward")
        stash = (row.stash or "-") + (f" {row.codec}" if row.codec else "")
        rows.append(
            (
                row.name,
                "x".join(map(str, row.shape)),
                row.algos or "-",
                stash,
                format_bytes(row.bytes),
                format_bytes(row.workspace) if row.workspace else "-",
                "-" if fwd is None else f"{fwd * 1e3:.2f}",
                "-" if bwd is None else f"{bwd * 1e3:.2f}",
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    if timeline is None:  # no measured times: drop those columns
        rows = [r[:-2] for r in rows]
        widths = widths[:-2]
    lines = [
        f"{plan.network} batch {plan.batch}{_precision(plan)} on {plan.device} ({format_bytes(plan.capacity)}), policy "
        f"{plan.policy}: peak {format_bytes(plan.peak_bytes)}, average {format_bytes(plan.average_bytes)}, "
        f"offloaded {format_bytes(plan.offloaded_bytes)}"
        + (f", packing {plan.packing:.3f}x the most bytes live at once" if plan.packing else "")
        + ("" if plan.fits else "  ** DOES NOT FIT **")
    ]
    lines.append("  ".join(str(c).ljust(w) for c, w in zip(rows[0], widths)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows[1:]]
    cats = ", ".join(f"{k} {format_bytes(v['peak'])}" for k, v in plan.by_category.items() if v.get("peak"))
    lines.append(f"peak by category: {cats}")
    return "\n".join(lines)


def _precision(plan: PlanResult) -> str:
    precision = getattr(plan, "precision", "fp32")
    return "" if precision == "fp32" else f" in {precision}"


def paper_accounting(program: Program, result: PlanResult) -> dict[str, int]:
    """vDNN's accounting of a planned step (Rhu et al., 2016), a view of the same plan for comparing with
    the paper's figures: the weights, every feature map (in-place layers share theirs), one dX and one dY
    sized to the largest feature map, and one workspace sized to the largest need under the plan's
    algorithms; no weight gradients, optimizer state or saved state such as argmax maps."""
    feature_maps = sum(t.nbytes for t in program.buffers())
    largest = max(t.nbytes for t in program.tensors)
    workspace = max((row.workspace for row in result.layers), default=0)
    out = {
        "weights": program.param_bytes,
        "feature_maps": feature_maps,
        "gradient_maps": 2 * largest,
        "workspace": workspace,
    }
    out["activations"] = feature_maps + 2 * largest + workspace
    out["total"] = out["activations"] + program.param_bytes
    return out
