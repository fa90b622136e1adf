"""Dtype rules: which dtype an op produces, found by asking numpy itself.

Dtype rules follow numpy 2 (NEP 50) by running the numpy function on empty dummies of the input
dtypes, cached. # Note: where numpy would produce float16 (``exp`` of ``int8``), which the wire
does not carry, the inputs are computed as float64 instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from ..dtypes import DTYPES, DType, from_numpy, is_complex, is_floating, to_numpy
from ..errors import OpDTypeError


def _dummy(dtype: DType, ndim: int = 1) -> np.ndarray[Any, Any]:
    return np.zeros((1,) * ndim, dtype=to_numpy(dtype))


@lru_cache(maxsize=4096)
def elementwise_rule(name: str, dtypes: tuple[DType, ...]) -> tuple[DType, DType | None]:
    """``(output dtype, compute dtype or None)`` for numpy function ``name`` on ``dtypes``.

    The compute dtype, when not None, is what the inputs are cast to before the call.

    Raises:
        OpDTypeError: numpy has no loop for these dtypes.
    """
    fn: Callable[..., Any] = getattr(np, name)
    ndim = 2 if name == "matmul" else 1
    for compute in (None, "float64"):
        args = [_dummy(compute or d, ndim) for d in dtypes]
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = fn(*args)
        except TypeError as exc:
            raise OpDTypeError(f"{name} does not support dtypes {', '.join(dtypes)}") from exc
        try:
            return from_numpy(np.asarray(result).dtype), compute
        except TypeError:
            continue  # float16 and friends: compute in float64 instead
    raise OpDTypeError(f"{name} does not support dtypes {', '.join(dtypes)}")


@lru_cache(maxsize=1024)
def reduce_rule(name: str, dtype: DType) -> tuple[DType, DType | None]:
    """``(output dtype, compute dtype or None)`` of reduction ``name`` on ``dtype``."""
    fn: Callable[..., Any] = getattr(np, name)
    for compute in (None, "float64"):
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = np.asarray(fn(_dummy(compute or dtype)))
        except TypeError as exc:
            raise OpDTypeError(f"{name} does not support dtype {dtype}") from exc
        if result.dtype.name in DTYPES:
            return from_numpy(result.dtype), compute
    raise OpDTypeError(f"{name} does not support dtype {dtype}")


def result_dtype(*dtypes: DType) -> DType:
    """numpy's promotion of array dtypes (the standard's table where it defines one). Many
    are promoted each dtype once: numpy holds the GIL through one call, and a join may name a
    million."""
    distinct = dtypes if len(dtypes) <= 8 else tuple(dict.fromkeys(dtypes))
    return from_numpy(np.result_type(*(to_numpy(d) for d in distinct)))


def float_dtype(dtype: DType) -> DType:
    """The floating dtype numpy's linalg computes ``dtype`` in."""
    return dtype if is_floating(dtype) or is_complex(dtype) else "float64"


def real_dtype(dtype: DType) -> DType:
    """The real dtype of ``dtype``'s kind (a complex dtype's component)."""
    parts: dict[str, DType] = {"complex64": "float32", "complex128": "float64"}
    return parts.get(dtype, float_dtype(dtype))


def complex_dtype(dtype: DType) -> DType:
    return "complex64" if dtype in ("float32", "complex64") else "complex128"
