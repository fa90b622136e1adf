"""The standard's named tuples for functions with several outputs."""

from __future__ import annotations

from typing import NamedTuple

from .array import RemoteArray


class UniqueAll(NamedTuple):
    values: RemoteArray
    indices: RemoteArray
    inverse_indices: RemoteArray
    counts: RemoteArray


class UniqueCounts(NamedTuple):
    values: RemoteArray
    counts: RemoteArray


class UniqueInverse(NamedTuple):
    values: RemoteArray
    inverse_indices: RemoteArray


class EighResult(NamedTuple):
    eigenvalues: RemoteArray
    eigenvectors: RemoteArray


class QRResult(NamedTuple):
    Q: RemoteArray
    R: RemoteArray


class SlogdetResult(NamedTuple):
    sign: RemoteArray
    logabsdet: RemoteArray


class SVDResult(NamedTuple):
    U: RemoteArray
    S: RemoteArray
    Vh: RemoteArray
