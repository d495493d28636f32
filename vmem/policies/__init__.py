"""Memory policies: pure decisions that turn a Program into a Plan.

``vmem.policies.get("baseline:algos=performance")`` returns a frozen, validated policy; ``names()`` lists
them. Spec strings are accepted wherever ``policy=`` is.
"""

from . import auto as _auto  # noqa: F401  (registers the policies)
from . import baseline as _baseline  # noqa: F401
from . import dyn as _dyn  # noqa: F401
from . import gist as _gist  # noqa: F401
from . import layerwise as _layerwise  # noqa: F401
from . import recompute as _recompute  # noqa: F401
from . import vdnn as _vdnn  # noqa: F401
from .base import Policy, get, names, parse_spec, register
from .plan import Allocation, Plan, Stash

__all__ = ["Policy", "Plan", "Stash", "Allocation", "get", "names", "parse_spec", "register"]
