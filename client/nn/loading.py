"""How a state dict's values are checked against a module's tensors (its parameters and
buffers) and written into them: all or nothing, in place on the device each tensor is on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from client.autodiff import Tensor


class StateDictError(ValueError):
    """A state dict does not fit a module: a name missing, a name the module lacks, or a
    shape that differs. The message names the first such mismatch."""


def load_into(owner: str, own: Mapping[str, Tensor], state: Mapping[str, Any]) -> None:
    """Copy ``state``'s values into the tensors ``own`` (by name) of module ``owner``, each
    cast to its tensor's dtype on its tensor's device, once every one fits.

    The values are written into the tensors' own arrays in place, so an optimizer built on
    them, and a step recorded by ``client.capture.jit`` that reads their arrays, see the loaded
    values. A tensor whose array cannot take them in place (a read-only numpy array) gets a new
    array of its own instead.

    Raises:
        StateDictError: naming the first mismatch: a missing name, then an unexpected one,
            then a shape that differs.
    """
    _check_fits(owner, own, state)
    ready = [(tensor, _on_device_of(tensor, state[name])) for name, tensor in own.items()]
    for tensor, value in ready:  # only once every value is ready: all or nothing
        if _writable(tensor.array):
            tensor.array[...] = value
        else:  # a copy: never the caller's array, which its owner may go on updating
            tensor.array = tensor.namespace.xp.asarray(value, copy=True)
        tensor._version += 1  # a graph recorded before the load would differentiate old values


def _shape_of(value: Any) -> tuple[int, ...]:
    value = value.array if isinstance(value, Tensor) else value
    return tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))


def _check_fits(owner: str, own: Mapping[str, Tensor], state: Mapping[str, Any]) -> None:
    """Raise StateDictError naming the first way ``state`` does not fit ``own``."""
    missing = [name for name in own if name not in state]
    unexpected = [name for name in state if name not in own]
    tally = f"({len(missing)} missing, {len(unexpected)} unexpected in all)"
    if missing:
        raise StateDictError(
            f"load_state_dict: missing name {missing[0]!r}: the state dict has no value for "
            f"this parameter or buffer of {owner} {tally}"
        )
    if unexpected:
        raise StateDictError(
            f"load_state_dict: unexpected name {unexpected[0]!r}: {owner} has no parameter "
            f"or buffer of that name {tally}"
        )
    for name, param in own.items():
        shape = _shape_of(state[name])
        if shape != param.shape:
            raise StateDictError(
                f"load_state_dict: shape mismatch for {name!r}: the module's tensor has shape "
                f"{param.shape}, the state dict's value {shape}"
            )


def _on_device_of(param: Tensor, value: Any) -> Any:
    """``value`` as an array of ``param``'s namespace and dtype: itself when it already is
    one (a tensor's array), cast on the device when only its dtype differs, else through
    numpy (one read, one upload)."""
    value = value.array if isinstance(value, Tensor) else value
    xp = param.namespace.xp
    if not (hasattr(value, "__array_namespace__") and value.__array_namespace__() is xp):
        value = xp.asarray(np.asarray(value))
    return value if value.dtype == param.dtype else xp.astype(value, param.dtype)


def _writable(array: Any) -> bool:
    """Whether ``array`` takes values in place: any array but a read-only numpy one."""
    flags = getattr(array, "flags", None)
    return flags is None or bool(flags.writeable)
