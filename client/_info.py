"""``xp.__array_namespace_info__()``: the standard's inspection API, and the dtype functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol import DTYPES

from .device import Device

KINDS = {
    "bool": ("bool",),
    "signed integer": ("int8", "int16", "int32", "int64"),
    "unsigned integer": ("uint8", "uint16", "uint32", "uint64"),
    "integral": ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    "real floating": ("float32", "float64"),
    "complex floating": ("complex64", "complex128"),
    "numeric": tuple(d for d in DTYPES if d != "bool"),
}


@dataclass(frozen=True)
class FInfo:
    """The standard's ``finfo`` object: Python numbers, not numpy scalars."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class IInfo:
    bits: int
    max: int
    min: int
    dtype: np.dtype[Any]


def finfo(dtype: Any) -> FInfo:
    info = np.finfo(dtype)
    real = np.dtype(info.dtype)
    return FInfo(
        int(info.bits),
        float(info.eps),
        float(info.max),
        float(info.min),
        float(info.smallest_normal),
        real,
    )


def iinfo(dtype: Any) -> IInfo:
    info = np.iinfo(dtype)
    return IInfo(int(info.bits), int(info.max), int(info.min), np.dtype(info.dtype))


def isdtype(dtype: Any, kind: Any) -> bool:
    """The standard's ``isdtype``: ``kind`` is a dtype, a kind name or a tuple of them."""
    if isinstance(kind, tuple):
        return any(isdtype(dtype, k) for k in kind)
    dt = np.dtype(dtype)
    if isinstance(kind, str):
        if kind not in KINDS:
            raise ValueError(f"unknown dtype kind {kind!r}")
        return dt.name in KINDS[kind]
    return bool(dt == np.dtype(kind))


class Info:
    """What ``__array_namespace_info__()`` returns for a namespace on ``device``."""

    def __init__(self, device: Device) -> None:
        self._device = device

    def capabilities(self) -> dict[str, Any]:
        # Note: "data-dependent shapes" are supported at the cost of one round trip each
        # (nonzero, unique_*, boolean masks, repeat with array repeats).
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self) -> Device:
        return self._device

    def devices(self) -> list[Device]:
        return [self._device]

    def default_dtypes(self, *, device: Device | None = None) -> dict[str, np.dtype[Any]]:
        return {
            "real floating": np.dtype("float64"),
            "complex floating": np.dtype("complex128"),
            "integral": np.dtype("int64"),
            "indexing": np.dtype("int64"),
        }

    def dtypes(
        self, *, device: Device | None = None, kind: str | tuple[str, ...] | None = None
    ) -> dict[str, np.dtype[Any]]:
        names = DTYPES if kind is None else [d for d in DTYPES if isdtype(d, kind)]
        return {name: np.dtype(name) for name in names}
