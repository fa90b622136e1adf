"""Set functions: the ``unique_*`` family, each one op with data-dependent outputs (one round
trip)."""

from __future__ import annotations

from typing import Any

from protocol.ops import Unique
from protocol.ops.data import UNIQUE_OUTPUTS

from .._building import apply_many
from .._results import UniqueAll, UniqueCounts, UniqueInverse
from ..array import RemoteArray


def _unique(name: Any, x: RemoteArray) -> tuple[RemoteArray, ...]:
    count = len(UNIQUE_OUTPUTS[name])
    return apply_many(
        lambda out, more: Unique(out=out, more=more, op=name, x=x.tensor_id), count, x
    )


class SetFunctions:
    """Mixed into :class:`~client.namespace.Namespace`."""

    @staticmethod
    def unique_all(x: RemoteArray, /) -> UniqueAll:
        return UniqueAll(*_unique("unique_all", x))

    @staticmethod
    def unique_counts(x: RemoteArray, /) -> UniqueCounts:
        return UniqueCounts(*_unique("unique_counts", x))

    @staticmethod
    def unique_inverse(x: RemoteArray, /) -> UniqueInverse:
        return UniqueInverse(*_unique("unique_inverse", x))

    @staticmethod
    def unique_values(x: RemoteArray, /) -> RemoteArray:
        return _unique("unique_values", x)[0]
