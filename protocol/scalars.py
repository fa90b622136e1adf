"""Python scalars on the wire, and the dtype a Python scalar takes beside an array.

JSON has booleans, integers and floats but no complex numbers, so a complex scalar travels as
:class:`ComplexValue`. The promotion rule (:func:`scalar_dtype`) is the standard's for Python
scalars mixed with arrays, which is also numpy 2's "weak scalar" rule (NEP 50); client and
server both apply it.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from .dtypes import DTYPES, DType, is_bool, is_complex, is_floating, is_integer, to_numpy
from .errors import OpDTypeError, OpOverflowError

PyScalar = bool | int | float | complex


class ComplexValue(BaseModel):
    """A complex scalar on the wire (JSON has no complex numbers)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    real: float
    imag: float


Scalar = bool | int | float | ComplexValue


def scalar_to_python(value: Scalar) -> PyScalar:
    if isinstance(value, ComplexValue):
        return complex(value.real, value.imag)
    return value


def scalar_from_python(value: PyScalar) -> Scalar:
    if isinstance(value, complex):
        return ComplexValue(real=value.real, imag=value.imag)
    return value


def default_dtype(value: PyScalar) -> DType:
    """The dtype of a Python scalar on its own: the standard's default dtype of its kind."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    return "complex128"


def scalar_dtype(value: PyScalar, dtype: DType) -> DType:
    """The dtype a Python scalar takes beside an array of ``dtype`` (the standard's rule, and
    numpy 2's "weak scalar" promotion): the array's dtype when the scalar's kind fits in it,
    else the default dtype of the scalar's kind.
    """
    if isinstance(value, bool):
        return dtype
    if isinstance(value, int):
        return "int64" if is_bool(dtype) else dtype
    if isinstance(value, float):
        return dtype if is_floating(dtype) or is_complex(dtype) else "float64"
    if is_complex(dtype):
        return dtype
    return "complex64" if dtype == "float32" else "complex128"


def check_fits(value: PyScalar, dtype: DType) -> None:
    """Refuse a Python scalar that an array of ``dtype`` cannot hold as numpy 2 does: an integer
    out of an integer dtype's bounds, or too large for a float; a complex value in a real array.

    Raises:
        OpOverflowError: the integer does not fit.
        OpDTypeError: a complex value for a dtype that is not complex.
    """
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if is_integer(dtype):
            low, high = _INT_BOUNDS[dtype]
            if not low <= value <= high:
                raise OpOverflowError(f"Python integer {value} out of bounds for {dtype}")
        else:
            try:
                float(value)
            except OverflowError:
                raise OpOverflowError(f"Python integer {value} out of range for {dtype}") from None
    elif isinstance(value, complex) and not is_complex(dtype):
        raise OpDTypeError(f"a complex fill value cannot fill a {dtype} array")


# Each integer dtype's bounds, as Python ints: check_fits runs per scalar op, and np.iinfo is a
# costly call (bench/REASONS.md, 'Integer bounds table')
_INT_BOUNDS = {
    d: (int(np.iinfo(to_numpy(d)).min), int(np.iinfo(to_numpy(d)).max))  # type: ignore[type-var]
    for d in DTYPES
    if is_integer(d)
}
