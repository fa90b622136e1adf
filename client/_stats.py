"""What a device reports of its session: the server's counts (:class:`SessionStats`, a
``stats`` round trip) and what segment replay did (:class:`SegmentStats`, counted by the
client, ``client._segments``)."""

from __future__ import annotations

from dataclasses import dataclass

from protocol import StatsReply


@dataclass(frozen=True)
class SessionStats:
    """What the server holds for this session."""

    tensors: int
    tensor_bytes: int
    failed: int
    server_tensor_bytes: int = 0  # every session's tensor bytes (the memory budget in use)
    connections: int = 0  # open sessions on the server


def session_stats(r: StatsReply) -> SessionStats:
    return SessionStats(r.tensors, r.tensor_bytes, r.failed, r.server_tensor_bytes, r.connections)


@dataclass(frozen=True)
class SegmentStats:
    """What segment replay did in this session: ``hits``, segments sent as one op;
    ``misses``, segments looked at and sent op by op; ``registered``, registrations sent;
    ``segments``, registered now; ``evicted``, dropped as least recently used; ``refused``,
    registrations the server refused."""

    hits: int = 0
    misses: int = 0
    registered: int = 0
    segments: int = 0
    evicted: int = 0
    refused: int = 0
