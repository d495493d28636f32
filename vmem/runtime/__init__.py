"""Carrying a Schedule out on a device: the executor, its transfers, the device-side parameters, the
step's timeline."""

from .executor import Executor
from .report import StepReport
from .params import DeviceParams
from .timeline import Span, Timeline

__all__ = ["Executor", "StepReport", "DeviceParams", "Span", "Timeline"]
