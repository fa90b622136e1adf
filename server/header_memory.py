"""What a decoded message header holds, counted: pydantic's models of its ops, ids and names are
Python objects that no array's bytes count, up to 17 times the header's JSON (a batch of tiny
ops). Before a header is validated (``MessageDecoder(hold_header=...)``), what it will hold is
estimated from its text (:func:`estimate`: an upper bound for every message the protocol
has, bench/REASONS.md, 'Headers counted while decoded'); past :data:`UNCOUNTED` bytes, that
much is charged to its session's quota and the budget until the message is answered, and a
header that does not fit is refused whole, as an upload over the quota is, while the session
goes on. Less is not counted, a client's batch of 2048 ops (2.5 MB) among them, and neither
is a header of nothing but lists of ids (the frees and graph drops of one object: a session
whose quota is full must be able to free; 56 bytes an id at most): what such headers hold is
bounded by the connections and the messages each may queue.
"""

from __future__ import annotations

from protocol import ErrorCode, MessageLimitError

from .errors import StoreError
from .store import TensorStore

OBJECT_BYTES = 1024  # a JSON object of a header, decoded: a model, its fields, a name
ITEM_BYTES = 56  # an array element or member after the first (a comma): its slot and an int
UNCOUNTED = 4 << 20  # estimated bytes of a header that are not counted


class HeaderHold:
    """What a header's charge lives as long as (``server/budget.py``, ``hold_while``): the
    decoder, then the message's :class:`~server.incoming.Received`, which drops it once the
    message is answered; when it dies, the charge is given back."""

    __slots__ = ("__weakref__",)


def estimate(header: bytes, objects: int) -> int:
    """An upper bound of what ``header``, of ``objects`` JSON objects, holds once decoded
    (see the module docstring)."""
    return OBJECT_BYTES * objects + ITEM_BYTES * header.count(b",")


def hold_header(store: TensorStore, header: bytes) -> HeaderHold | None:
    """Charge what ``header`` will hold decoded to ``store`` (see the module docstring), held
    while the object returned lives (None: nothing charged).

    Raises:
        MessageLimitError: ``quota_exceeded`` or ``server_memory_exhausted``.
    """
    if len(header) * OBJECT_BYTES <= UNCOUNTED:
        return None
    objects = header.count(b"{")
    if objects == 1:  # the header's own: nothing but lists of ids
        return None
    nbytes = estimate(header, objects)
    if nbytes <= UNCOUNTED:
        return None
    what = f"a header of {len(header)} bytes holds up to {nbytes} bytes decoded"
    if nbytes > store.free_quota():
        raise MessageLimitError(
            f"{what}; the session's quota has {store.free_quota()} left",
            ErrorCode.QUOTA_EXCEEDED,
        )
    try:
        store.budget.reserve(nbytes, store.in_use())
    except StoreError as exc:
        raise MessageLimitError(f"{what}: {exc}", exc.code) from None
    held = HeaderHold()
    store.budget.hold_while(held, nbytes, store.headers)
    return held


__all__ = ["ITEM_BYTES", "OBJECT_BYTES", "UNCOUNTED", "HeaderHold", "estimate", "hold_header"]
