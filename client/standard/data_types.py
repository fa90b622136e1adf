"""Data type functions: casts, promotion and the dtype inspection functions."""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from protocol import OpArgumentError, to_numpy
from protocol.scalars import scalar_dtype

from .._handle import common_device, wire_dtype
from .._info import FInfo, IInfo, finfo, iinfo, isdtype
from ..array import RemoteArray
from ..device import Device


class DataTypeFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def astype(
        x: RemoteArray, dtype: Any, /, *, copy: builtins.bool = True, device: Device | None = None
    ) -> RemoteArray:
        common_device((x,))  # a numpy array here is named in a TypeError
        return x.astype(dtype, copy=copy, device=device)

    @staticmethod
    def result_type(*arrays_and_dtypes: Any) -> np.dtype[Any]:
        """The standard's promotion; Python scalars are weak (they take the arrays' dtype
        where their kind fits)."""
        items = [a.dtype if isinstance(a, RemoteArray) else a for a in arrays_and_dtypes]
        dtypes = [np.dtype(a) for a in items if not isinstance(a, bool | int | float | complex)]
        scalars = [a for a in items if isinstance(a, bool | int | float | complex)]
        if not dtypes:
            # array_api_strict's error and words; also a TypeError, which this raised before
            raise OpArgumentError("at least one array or dtype is required")
        result = wire_dtype(np.result_type(*dtypes))
        for value in scalars:
            result = wire_dtype(np.result_type(result, scalar_dtype(value, result)))
        return to_numpy(result)

    @staticmethod
    def can_cast(from_: Any, to: Any, /) -> builtins.bool:
        source = from_.dtype if isinstance(from_, RemoteArray) else from_
        return builtins.bool(np.can_cast(np.dtype(source), np.dtype(to), casting="safe"))

    @staticmethod
    def finfo(type: Any, /) -> FInfo:  # noqa: A002
        return finfo(type.dtype if isinstance(type, RemoteArray) else type)

    @staticmethod
    def iinfo(type: Any, /) -> IInfo:  # noqa: A002
        return iinfo(type.dtype if isinstance(type, RemoteArray) else type)

    @staticmethod
    def isdtype(dtype: Any, kind: Any) -> builtins.bool:
        return isdtype(dtype, kind)
