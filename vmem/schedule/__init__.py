"""Program + Plan -> Schedule (typed steps), and what reads a Schedule.

- :mod:`.steps`: the step kinds, buffer keys and the :class:`Schedule` (imported here: the executor's view);
- :mod:`.lower` and :mod:`.layerwise`: the lowering of a Plan;
- :mod:`.pack`: placement of the step's blocks in the arena;
- :mod:`.replay`: the figures of a schedule on a simulated device (peak, average, time, stalls).

This package imports only the steps, so that reading a Schedule does not import the lowering (nor,
through it, the policies).
"""

from .steps import STEPS, Buffer, Key, Kind, Schedule, Step

__all__ = ["Schedule", "Step", "STEPS", "Buffer", "Key", "Kind"]
