"""How an array shows its values: ``repr`` and ``str`` as numpy prints them.

Printing reads the values (one round trip for a remote array). An array numpy would summarise
(more than ``threshold`` elements, ``np.set_printoptions``) is not downloaded whole: only the
corners numpy shows are gathered on its device, in one indexing op, with one element more
along each summarised axis (a stand-in for the elided middle, never shown), and numpy prints
them summarised, so the text is the one it prints for the whole array.

Printing values can be turned off, for code that must not wait on a read (a ``repr`` in a
log line, a debugger's variable view): ``TENSORWIRE_PRINT_VALUES=0``, or
:func:`print_values` (a function and a context manager). Then ``repr`` and ``str`` show the
shape, dtype and device only.

Generic over the standard: it needs of an array only ``shape``, indexing with integer arrays
and ``np.asarray``, so the autodiff tensors print their wrapped arrays through it too.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import numpy as np

ENV = "TENSORWIRE_PRINT_VALUES"  # "0" (or "false", "no", "off"): repr and str read nothing

_printing: ContextVar[bool] = ContextVar(
    "tensorwire_print_values",
    default=os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off"),
)


class print_values:  # noqa: N801 - a function to its callers, as torch.set_grad_enabled
    """Turn value printing on or off: ``client.print_values(False)`` for the rest of the
    context (thread, task), or ``with client.print_values(False): ...`` for a block (the
    setting before it comes back after it)."""

    def __init__(self, on: bool) -> None:
        self._token = _printing.set(bool(on))

    def __enter__(self) -> print_values:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _printing.reset(self._token)


def printing_values() -> bool:
    """Whether ``repr`` and ``str`` read values now."""
    return _printing.get()


def shown_values(array: Any) -> tuple[np.ndarray[Any, Any], bool]:
    """The values numpy shows of ``array`` (one read), and whether it summarises them: all of
    them, or, for an array over numpy's ``threshold``, its corners with one stand-in element
    for each elided middle (:func:`format_values` prints them as numpy prints the whole)."""
    if isinstance(array, np.ndarray | np.generic):
        return np.asarray(array), False
    shape = tuple(int(d) for d in array.shape)
    options = np.get_printoptions()
    size = 1
    for d in shape:
        size *= d
    if size <= options["threshold"]:
        return np.asarray(array), False
    edge = options["edgeitems"]
    if all(d <= 2 * edge + 1 for d in shape):
        return np.asarray(array), True
    # the kept indices of each axis, shaped to broadcast against the others' (np.ix_)
    kept = [np.arange(d) if d <= 2 * edge + 1 else np.r_[0 : edge + 1, d - edge : d] for d in shape]
    return np.asarray(array[np.ix_(*kept)]), True


def format_values(
    values: np.ndarray[Any, Any], summarised: bool, prefix: str = "", separator: str = " "
) -> str:
    """``values`` as numpy prints them (``prefix``: the text before them on the first line,
    as ``np.array2string`` takes it); ``summarised``: they are :func:`shown_values`' corners."""
    if not summarised:
        return np.array2string(values, separator=separator, prefix=prefix)
    with np.printoptions(threshold=0):
        return np.array2string(values, separator=separator, prefix=prefix)


def array_repr(array: Any, name: str, extras: str) -> str:
    """``NAME([values], EXTRAS)``, the values as numpy's repr writes them."""
    values, summarised = shown_values(array)
    text = format_values(values, summarised, prefix=f"{name}(", separator=", ")
    return f"{name}({text}, {extras})"


def array_str(array: Any) -> str:
    """The values as numpy's ``str`` writes them (a 0-d array as its scalar)."""
    values, summarised = shown_values(array)
    if values.ndim == 0:
        return str(values[()])
    return format_values(values, summarised)
