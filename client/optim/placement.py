"""Where an optimizer's state lives: beside its parameter, on the same device, moved there
through numpy when the parameter moved (``Module.to``), and loaded there in place."""

from __future__ import annotations

from typing import Any

import numpy as np

from client.autodiff import Tensor


def lives_with(value: Any, array: Any) -> bool:
    """Whether ``value`` (an array) is where ``array`` is: the same type, the same device."""
    return type(value) is type(array) and value.device == array.device


def follow(value: Any, array: Any, xp: Any) -> Any:
    """``value`` (an array) where ``array`` lives: itself, or, if ``array`` is of another type
    or on another device (a model moved to a server), a copy moved there through numpy."""
    # Local attribute reads only, as this runs for every state array at every step.
    if type(value) is not type(array) or value.device != array.device:
        return xp.asarray(np.array(value, copy=True))
    return value


def load_array(old: Any, value: Any, param: Tensor, dtype: Any) -> Any:
    """``value``'s contents where ``param`` lives, in ``dtype``: written into ``old`` in place
    when ``old`` is there with that shape and dtype (a recorded step holds it), else a new
    array of its own (never ``value`` itself, which its owner may go on updating)."""
    array, xp = param.array, param.namespace.xp
    moved = follow(value, array, xp)
    if moved.dtype != dtype:
        moved = xp.astype(moved, dtype)
    if (
        old is not None
        and lives_with(old, array)
        and (old.shape, old.dtype) == (moved.shape, dtype)
    ):
        old[...] = moved
        return old
    return moved if moved is not value else xp.asarray(value, copy=True)
