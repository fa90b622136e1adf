"""What goes wrong when differentiating, each error named after what happened.

::

    AutodiffError (RuntimeError)
    ├── NoGradientError        an op without a gradient was differentiated
    ├── GraphFreedError        backward() through a graph an earlier backward() freed
    ├── ModifiedInPlaceError   a tensor the graph needs was changed in place since
    ├── NotDifferentiableError .grad or backward() of a tensor that does not require grad,
    │                          backward() of a non-scalar without an output gradient
    └── DeviceMismatchError    (also ValueError) one op over tensors of two devices
"""

from __future__ import annotations


class AutodiffError(RuntimeError):
    """The root of every autodiff error."""


class NoGradientError(AutodiffError):
    """The output of an op that has no gradient here was differentiated (its name is said)."""


class GraphFreedError(AutodiffError):
    """backward() reached a graph that an earlier backward() freed (retain_graph=False)."""


class ModifiedInPlaceError(AutodiffError):
    """A tensor recorded by the graph was modified in place before backward() needed it."""


class NotDifferentiableError(AutodiffError):
    """The tensor takes no part in differentiation, or needs an output gradient to."""


class DeviceMismatchError(AutodiffError, ValueError):
    """One op was given tensors that live on two devices."""
