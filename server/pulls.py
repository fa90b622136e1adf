"""The ``pull`` op: a tensor copied into this session from a capability (``server/exposures.py``)
that another session exposed, on this server (a copy in memory) or on a peer server (fetched
by :data:`~server.exposures.Fetch`, the network side, ``server/peers.py``). No I/O here.

A pull runs in a pull thread (a copy or a transfer is never cheap enough for the loop; pulls
have threads of their own, ``server/workers.py``). Its output is reserved before the bytes are
fetched, like any op's, and no more is ever allocated for it (``server/peers.py`` refuses a
reply that declares more); the reservation is given back if the pull fails: a source that
refuses, lies about the size, is unreachable or dies midway fails the op (``transfer_failed``,
``capability_refused``), as any failed op, and the session and its accounting go on unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol import ErrorCode, InvalidOpError, TensorMeta, to_numpy
from protocol.ops import Pull

from .errors import StoreError
from .exposures import Exposures, Fetch
from .limits import output_bytes
from .outcome import Job, Outcomes


@dataclass(frozen=True)
class Transfers:
    """What a server gives its sessions for direct transfers: its open capabilities, its id
    (a pull claims as this server), and the network side of pulls from peers (None: only
    pulls from this server)."""

    exposures: Exposures
    server_id: str
    fetch: Fetch | None = None


class Pulls:
    """Runs one session's ``pull`` ops. ``transfers`` None: every pull fails (the device in
    the client's process has no server to pull from)."""

    def __init__(self, outcomes: Outcomes, transfers: Transfers | None) -> None:
        self.outcomes = outcomes
        self.transfers = transfers

    def run(self, op: Pull, job: Job, inline: bool) -> bool:
        """Run ``op``; False while ``inline`` (a pull thread runs it)."""
        if inline:
            return False
        store, outcomes = self.outcomes.store, self.outcomes
        try:
            if op.out in store:
                raise StoreError(ErrorCode.DUPLICATE_TENSOR, f"tensor id #{op.out} is in use")
            if job.rejected is not None:
                raise StoreError(job.rejected.code, job.rejected.message)
            metas = op.infer_all()
            nbytes = output_bytes(metas, outcomes.limits)
            store.reserve(nbytes)
        except StoreError as exc:
            outcomes.fail(op, exc.code, str(exc), job)
            return True
        except InvalidOpError as exc:
            outcomes.fail(op, ErrorCode.INVALID_OP, str(exc), job)
            return True
        try:
            array = _checked(op, self._fetch(op, metas[0]))
        except StoreError as exc:
            store.cancel(nbytes)
            outcomes.fail(op, exc.code, str(exc), job)
            return True
        except Exception as exc:  # noqa: BLE001 - anything else fails the op, not the session
            store.cancel(nbytes)
            message = f"{op.describe()} failed: {type(exc).__name__}: {exc}"
            outcomes.fail(op, ErrorCode.TRANSFER_FAILED, message, job)
            return True
        outcomes.keep(op, array, metas, nbytes, job)
        return True

    def _fetch(self, op: Pull, meta: TensorMeta) -> np.ndarray[Any, Any]:
        """The pulled array, as exposed (``outcomes.keep`` checks it against the op).

        Raises:
            StoreError: ``transfer_failed`` or ``capability_refused``.
        """
        transfers = self.transfers
        if transfers is None:
            raise StoreError(
                ErrorCode.TRANSFER_FAILED,
                "this device runs in the client's process: it cannot pull from a server",
            )
        if op.source is None:
            exposure = transfers.exposures.claim(op.capability, transfers.server_id, meta)
            return np.array(exposure.array, order="C")  # the one copy: no network
        if transfers.fetch is None:
            raise StoreError(ErrorCode.TRANSFER_FAILED, "this server pulls from no peers")
        return transfers.fetch(op, transfers.server_id)


def _checked(op: Pull, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` if it is what ``op`` says it pulls.

    Raises:
        StoreError: ``transfer_failed``, another shape or dtype.
    """
    expected = (tuple(op.shape), to_numpy(op.dtype))
    if (array.shape, array.dtype) != expected:
        where = "this server" if op.source is None else op.source
        raise StoreError(
            ErrorCode.TRANSFER_FAILED,
            f"the capability's tensor on {where} is {array.dtype} of shape {array.shape}; the "
            f"pull said {expected[1]} of shape {expected[0]}",
        )
    return array
