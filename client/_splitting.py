"""Batches cut to a server's message limit (``Welcome.max_message_size``).

A message over the server's ``--max-message-size`` closes the connection, so a connection to a
server with a small limit measures each batch it sends and cuts one that is too large into
messages that fit: its ops in halves, in order, each half with the buffers its uploads read.
The server runs them in order, as it would have run the one batch. Buffers alone are kept within
the limit as they are added (:meth:`client._pending.Pending.needs_room`).
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol import Batch
from protocol.codec import encode_header
from protocol.ops import FromBuffer

Message = tuple[Batch, list[memoryview]]

# Limits from which no batch is measured: a batch's header (at most a flush's 2,048 ops) cannot
# reach the half of the limit that its buffers leave it.
MEASURED_BELOW = 64 << 20


def within(limit: int, batch: Batch, buffers: list[memoryview]) -> list[Message]:
    """``batch`` and its ``buffers`` as messages of at most ``limit`` bytes: cut in halves of its
    ops (the frees, graph drops and requests ride with the last part, so they follow every op,
    as in one batch), then of its frees. A batch with graph registrations stays whole, and so
    does one op with its buffers: :meth:`~client._pending.Pending.needs_room` refused those."""
    size = len(encode_header(batch, aligned=bool(buffers))) + sum(b.nbytes for b in buffers)
    uploads = sum(isinstance(op, FromBuffer) for op in batch.ops)
    if size <= limit or batch.graphs or uploads != len(buffers):
        return [(batch, buffers)]
    if len(batch.ops) < 2:
        if len(batch.frees) < 2:
            return [(batch, buffers)]
        half = len(batch.frees) // 2  # the ops and the first frees, then the rest
        first = Batch(ops=batch.ops, frees=batch.frees[:half], buffers=batch.buffers, ack=batch.ack)
        rest = batch.model_copy(update={"ops": [], "frees": batch.frees[half:], "buffers": []})
        return within(limit, first, buffers) + within(limit, rest, [])
    half = len(batch.ops) // 2
    cut = sum(isinstance(op, FromBuffer) for op in batch.ops[:half])  # uploads' buffers in order
    first = Batch(ops=batch.ops[:half], buffers=batch.buffers[:cut], ack=batch.ack)
    rest = batch.model_copy(
        update={"ops": _renumbered(batch.ops[half:], cut), "buffers": batch.buffers[cut:]}
    )
    return within(limit, first, buffers[:cut]) + within(limit, rest, buffers[cut:])


def _renumbered(ops: Sequence[object], cut: int) -> list[object]:
    """``ops`` whose uploads name their buffers ``cut`` places earlier."""
    return [
        op.model_copy(update={"buffer": op.buffer - cut}) if isinstance(op, FromBuffer) else op
        for op in ops
    ]
