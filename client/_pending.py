"""The batch a connection is filling: ops, uploads, graph registrations, and the ids freed and
graphs dropped since the last flush, until a flush takes them as one :class:`~protocol.Batch`.

Ops, buffers and registrations are added under the connection's lock. Frees and drops are
recorded without one (they come from ``__del__``, in any thread, at any time; a deque's append
is atomic) and are taken with the batch: the server runs a batch's graph registrations, then its
ops, then its frees, then its graph drops, so a free or a drop never overtakes an op sent
before it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from protocol import Batch
from protocol.graphs import GraphDef, RegisterGraph
from protocol.messages import Request
from protocol.ops import AnyOp

from ._splitting import MEASURED_BELOW, within
from .errors import MessageTooLargeError

COPY_BELOW = 1 << 20  # uploads smaller than this are copied; larger ones are sent before return
# The bytes of a message's limit kept for its header (its ops, the registration a buffer belongs
# to), at most: an eighth of a small limit.
HEADER_ROOM = 1 << 16
# Frees in one message: 32,768 ids are at most ~460 KB of header, far under a server's
# --max-header-size (4 MiB by default), however many handles were dropped since the last flush.
MAX_FREES = 32_768


class Pending:
    """What the next flush sends; ``buffered`` counts the bytes of ``buffers``. ``limit`` is
    the server's largest message (None: not said), which the connection sets once."""

    __slots__ = ("ops", "buffers", "buffered", "frees", "graphs", "drops", "limit")

    def __init__(self) -> None:
        self.ops: list[AnyOp] = []
        self.buffers: list[memoryview] = []
        self.buffered = 0
        self.frees: collections.deque[int] = collections.deque()  # tensor ids
        self.graphs: list[RegisterGraph] = []
        self.drops: collections.deque[int] = collections.deque()  # graph ids
        self.limit: int | None = None

    def __bool__(self) -> bool:
        return bool(self.ops or self.frees or self.buffers or self.graphs or self.drops)

    def add_upload(self, make_op: Callable[[int], AnyOp], data: memoryview) -> bool:
        """Add the op ``make_op(buffer_index)`` whose bytes are ``data`` (see
        :meth:`_add_buffers`, which says what True means)."""
        self.ops.append(make_op(len(self.buffers)))
        return self._add_buffers((data,))

    def add_graph(self, graph_id: int, graph: GraphDef, constants: Sequence[memoryview]) -> bool:
        """Add the registration of ``graph`` under ``graph_id``, whose constants' bytes are
        ``constants``, in order (see :meth:`_add_buffers`)."""
        first = len(self.buffers)
        self.graphs.append(RegisterGraph(graph_id=graph_id, graph=graph, first_buffer=first))
        return self._add_buffers(constants)

    def _add_buffers(self, data: Sequence[memoryview]) -> bool:
        """Append ``data`` as the batch's next buffers; a small one is copied, so its caller
        may change it at once. True when one is large: the caller must send the batch before
        it returns."""
        large = False
        for view in data:
            if view.nbytes < COPY_BELOW:
                view = memoryview(bytes(view))
            else:
                large = True
            self.buffers.append(view)
            self.buffered += view.nbytes
        return large

    def needs_room(self, data: Sequence[memoryview]) -> bool:
        """Whether this batch must be sent before the buffers ``data`` join it, for its
        message to stay within the server's limit: a batch's buffers take at most half of what
        the limit leaves for data, so that its ops' header has room too.

        Raises:
            MessageTooLargeError: ``data`` do not fit in any message the server takes.
        """
        limit = self.limit
        if limit is None:
            return False
        nbytes = sum(view.nbytes for view in data)
        room = limit - min(HEADER_ROOM, limit // 8)
        if nbytes > room:
            raise MessageTooLargeError(
                f"an upload of {nbytes} bytes does not fit in one message to this server: it "
                f"takes messages of at most {limit} bytes (--max-message-size), {room} of them "
                "for data; upload smaller parts (and join them with xp.concat), or raise the "
                "server's limit"
            )
        return bool(self) and self.buffered + nbytes > room // 2

    def messages(
        self, requests: Sequence[Request], ack: int = 0
    ) -> list[tuple[Batch, list[memoryview]]]:
        """The batches to send with ``requests``, and their buffers: one, unless more than
        :data:`MAX_FREES` ids were freed; then the first carries the ops and as many frees,
        the next ones the following frees, the last the requests (so a free never overtakes
        an op sent before it, and the requests are answered after every free). Each carries
        ``ack`` (``Batch.ack``)."""
        taken = [self.take((), MAX_FREES, ack) for _ in range(len(self.frees) // MAX_FREES)]
        taken.append(self.take(requests, MAX_FREES, ack))
        limit = self.limit
        if limit is not None and limit < MEASURED_BELOW:  # cut to the server's limit
            return [part for message in taken for part in within(limit, *message)]
        return taken

    def take(
        self, requests: Sequence[Request], max_frees: int | None = None, ack: int = 0
    ) -> tuple[Batch, list[memoryview]]:
        """The batch to send with ``requests``, and its buffers; this is empty again after,
        but for the frees past ``max_frees``."""
        count = len(self.frees) if max_frees is None else min(max_frees, len(self.frees))
        frees = [self.frees.popleft() for _ in range(count)]
        drops = [self.drops.popleft() for _ in range(len(self.drops))]
        batch = Batch(
            graphs=self.graphs,
            ops=self.ops,
            frees=frees,
            drop_graphs=drops,
            requests=list(requests),
            buffers=[b.nbytes for b in self.buffers],
            ack=ack,
        )
        buffers = self.buffers
        self.ops, self.graphs, self.buffers, self.buffered = [], [], [], 0
        return batch, buffers
