"""What a Trainer says when a step goes wrong: encodings larger than planned (their values kept in host
memory), and the error that stops training after steps whose loss or gradients were not finite."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from ..errors import NonFiniteError

if TYPE_CHECKING:
    from ..policies.base import Policy

__all__ = ["spill_warning", "nonfinite_error"]


def spill_warning(net_name: str, step: int, spilled: Any, density: float | None, policy: Policy) -> str:
    """The warning for a step (number ``step``) whose encodings ``spilled`` ((key, needed, planned) each) came
    out larger than their planned blocks under ``policy``, which planned them at ``density`` (or None)."""
    key, needed, planned = spilled[0]
    more = f" (and {len(spilled) - 1} more)" if len(spilled) > 1 else ""
    return (
        f"{net_name}: step {step}: the encoding of {key} needs {needed} bytes, its planned "
        f"block holds {planned}{more}: the data are denser than the plan assumes"
        + (f" ({density:g})" if density is not None else "")
        + "; their values are kept in host memory instead (the same numbers, slower)"
        + (
            f"; plan with a higher density ({policy.name}:density=...) to keep them encoded on the device"
            if hasattr(policy, "density")
            else ""
        )
    )


def nonfinite_error(net_name: str, in_a_row: int, steps_done: int, first_nonfinite: str | None) -> NonFiniteError:
    """The error after ``in_a_row`` steps in a row that were not finite (the last bad batch run again with
    every output looked at: ``first_nonfinite`` names the first op whose output was not)."""
    where = (
        f"the first output that is not finite: {first_nonfinite}"
        if first_nonfinite
        else "every op's output was finite when the batch was run again: the loss itself is not"
    )
    return NonFiniteError(
        f"{net_name}: {in_a_row} steps in a row had a loss or gradients that were not finite (after step "
        f"{steps_done}); {where}; lower the learning rate or look at the data"
    )
