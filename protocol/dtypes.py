"""The dtypes that may travel on the wire, and their numpy counterparts.

The bottom of the protocol: it imports nothing else of the project.

Only the numeric dtypes of the Python Array API standard exist here. Everything travels
little-endian; object, string, void and structured dtypes cannot even be named.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

DType = Literal[
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
]

DTYPES: tuple[DType, ...] = get_args(DType)

_NUMPY: dict[DType, np.dtype[np.generic]] = {
    name: np.dtype(name).newbyteorder("<") for name in DTYPES
}
_BY_NUMPY: dict[np.dtype[np.generic], DType] = {dt: name for name, dt in _NUMPY.items()}


def to_numpy(dtype: DType) -> np.dtype[np.generic]:
    """The little-endian numpy dtype for a wire dtype name."""
    return _NUMPY[dtype]


def from_numpy(dtype: np.dtype[np.generic] | type | str) -> DType:
    """The wire name of a numpy dtype.

    Raises:
        TypeError: the dtype is not one of the standard's numeric dtypes (object, string,
            structured, datetime, float16, ... are refused).
    """
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    name = _BY_NUMPY.get(dt)
    if name is None:
        raise TypeError(f"dtype {dt} is not supported; use one of: {', '.join(DTYPES)}")
    return name


def itemsize(dtype: DType) -> int:
    return _NUMPY[dtype].itemsize


def is_bool(dtype: DType) -> bool:
    return dtype == "bool"


def is_integer(dtype: DType) -> bool:
    return dtype.startswith(("int", "uint"))


def is_floating(dtype: DType) -> bool:
    return dtype.startswith("float")


def is_complex(dtype: DType) -> bool:
    return dtype.startswith("complex")
