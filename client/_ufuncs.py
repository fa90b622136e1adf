"""numpy's ufuncs on remote arrays: ``np.exp(x)``, ``np.add(a, x)``.

A numpy ufunc that is one of the standard's element-wise functions runs on the device as that
function's op and returns a remote array; its numpy operands are uploaded, and a Python scalar
is weak as in any op. So ``np_array + x`` stays a remote array, as it always was. ``out=`` is
written: a remote ``out`` in place on the device, a numpy one with the result's values (one
read). Any other ufunc (``scipy.special.erf``, a ufunc method such as ``np.add.reduce``, a
keyword such as ``where=``) raises a ``TypeError`` that names what to call instead: the
namespace's function of that name where there is one, or ``np.asarray(x)`` to compute locally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast, get_args

import numpy as np

from protocol.ops import BinaryName, UnaryName

from ._handle import Handle

if TYPE_CHECKING:
    from .array import RemoteArray

# numpy's names of ufuncs whose standard name differs (``ufunc.__name__`` is numpy's own name:
# ``np.acos.__name__ == "arccos"``).
_STANDARD_NAMES = {
    "absolute": "abs",
    "arccos": "acos",
    "arccosh": "acosh",
    "arcsin": "asin",
    "arcsinh": "asinh",
    "arctan": "atan",
    "arctan2": "atan2",
    "arctanh": "atanh",
    "conjugate": "conj",
    "invert": "bitwise_invert",
    "left_shift": "bitwise_left_shift",
    "power": "pow",
    "right_shift": "bitwise_right_shift",
    "rint": "round",  # both round half to even
}

# The standard's element-wise functions: one op each, the namespace's function of that name.
_ELEMENTWISE = frozenset(get_args(UnaryName) + get_args(BinaryName))

# The namespace's function for a ufunc method numpy's reductions call (``np.sum`` calls
# ``np.add.reduce``): what a refusal suggests instead.
_METHOD_FUNCTIONS = {
    ("add", "reduce"): "sum",
    ("multiply", "reduce"): "prod",
    ("maximum", "reduce"): "max",
    ("minimum", "reduce"): "min",
    ("logical_and", "reduce"): "all",
    ("logical_or", "reduce"): "any",
    ("add", "accumulate"): "cumulative_sum",
    ("multiply", "accumulate"): "cumulative_prod",
}


class NumpyUfuncs:
    """Mixed into :class:`~client.array.RemoteArray`."""

    __slots__ = ()

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        xp = cast("RemoteArray", self).__array_namespace__()
        name = _STANDARD_NAMES.get(ufunc.__name__, ufunc.__name__)
        known = getattr(np, ufunc.__name__, None) is ufunc and name in _ELEMENTWISE
        out = kwargs.pop("out", None)
        if not known or method != "__call__" or kwargs:
            if method != "__call__":
                name = _METHOD_FUNCTIONS.get((ufunc.__name__, method), "")
            instead = name if hasattr(xp, name) else None
            raise TypeError(_refusal(ufunc, method, kwargs if known else {}, instead))
        result = getattr(xp, name)(*inputs)
        return result if out is None else _written(out[0], result)


def _written(out: Any, result: RemoteArray) -> Any:
    """``out`` holding ``result``'s values: a remote ``out`` written on the device, a numpy one
    with the values read back (numpy's casting rule for ``out=``)."""
    if isinstance(out, Handle):  # a RemoteArray
        cast("RemoteArray", out)[...] = result
    else:
        np.copyto(out, result.numpy(), casting="same_kind")
    return out


def _refusal(ufunc: np.ufunc, method: str, kwargs: dict[str, Any], xp_name: str | None) -> str:
    """The message of a ufunc call that cannot run on the device: what to call instead."""
    call = f"{ufunc.__name__}" if method == "__call__" else f"{ufunc.__name__}.{method}"
    if method != "__call__":
        why = f"numpy's ufunc method {call} cannot run on a remote array"
    elif kwargs:
        why = f"numpy's {call} with {', '.join(sorted(kwargs))}= cannot run on a remote array"
    else:
        why = f"the ufunc {call} is not one of numpy's element-wise functions the server runs"
    instead = f"call xp.{xp_name}(...) to run it on the device, or " if xp_name else "call "
    return f"{why}: {instead}np.asarray(x) to compute it locally (one read)"
