"""Reverse-mode automatic differentiation over any Array API namespace.

The pattern of Burn's ``Autodiff<B>``: a wrapper over a backend, here any namespace that
follows the Python Array API standard. Over a remote namespace the forward and backward passes
are ordinary ops of that namespace, so gradients are computed on the server and never travel
unless read; over numpy the same code runs locally, for comparison.

::

    import numpy as np
    from client.autodiff import Autodiff, no_grad

    ad = Autodiff(client.namespace(dev))           # or Autodiff(np)
    w = ad.asarray(np.zeros((3, 1), np.float32), requires_grad=True)
    loss = ad.mean((ad.asarray(x) @ w - ad.asarray(y)) ** 2)
    loss.backward()
    with no_grad():
        w -= 0.1 * w.grad

This package imports nothing of ``client`` outside itself: it only calls the standard's
functions of the namespace it wraps (pyproject.toml's import contracts hold that).
"""

from __future__ import annotations

from .errors import AutodiffError as AutodiffError
from .errors import DeviceMismatchError as DeviceMismatchError
from .errors import GraphFreedError as GraphFreedError
from .errors import ModifiedInPlaceError as ModifiedInPlaceError
from .errors import NoGradientError as NoGradientError
from .errors import NotDifferentiableError as NotDifferentiableError
from .mode import enable_grad as enable_grad
from .mode import is_grad_enabled as is_grad_enabled
from .mode import no_grad as no_grad
from .namespace import DIFFERENTIABLE as DIFFERENTIABLE
from .namespace import Autodiff as Autodiff
from .tensor import Tensor as Tensor
