"""Segment replay: a connection recognises the ops it sends between two blocking requests when
they repeat, registers them once as a graph, and sends each later occurrence as one
``run_segment`` op (``protocol.ops.RunSegment``), which the server runs by the graph's plan
while leaving the session as the ops sent one by one would (``server/segments.py``).

At each flush that carries a request (a read, a sync, stats, a describe), :meth:`Segmenter.flush`
takes the ops since the last such flush (a flush without one, by the batch's size, an
explicit ``flush`` or an acknowledgement, breaks the segment: it is not looked at). Its
structure (``client._structure``) is looked up:

- registered and known to hold: its ops, but its uploads, become one ``run_segment`` op with
  their inputs and the first id they made, after the uploads (a *hit*);
- seen :data:`SIGHTINGS` times before (a segment whose op types were never seen is not even
  keyed: noting them costs far less than a key, and a new segment pays only that): its graph
  is registered with this batch, whose ops go one by one (a *miss*); the registration is known
  to hold once the reply to this batch's request has arrived without a
  :class:`~protocol.GraphRefused` before it (the server answers in order), and a refused one
  is never tried again: that structure goes op by op;
- else: counted, and sent op by op (a *miss*).

Why two sightings (keyed, after a first whose op types alone were noted): a step seen twice
is the loop's (the first pass of a loop often differs: lazy state, a first batch), and a loop's
fourth step is its first replayed; registering what is seen once would register every read of
a script, and a graph replayed once by ``Graph.replay`` after its capture is not a loop. The
op types of a segment whose structure is new every time (a Python scalar that changes every
step) are keyed :data:`MOST_NOVEL` times, then no longer: such a loop pays for its key only
while it may still repeat. Python scalars are part
of the key by value: the training loops keep what changes (a learning rate, Adam's bias
corrections) on the device, so their steps repeat; a scalar that changes every step makes a
new structure every step, which is never registered. The one exception is the float value of
a ``full`` (how a schedule writes the device's learning rate between steps): it changes no
inference, cost or error, so it travels with each run instead (``RunSegment.scalars``).

The registered segments are bounded (:data:`MOST_SEGMENTS`, least recently used out: its
graph is dropped; each eviction of a segment never replayed doubles the sightings a
registration needs, up to :data:`MOST_SIGHTINGS`: structures that recur less often than the
cache holds cost a registration each and save nothing), within the server's
``--max-graphs`` shared with ``client.capture.jit``'s graphs (a registration over it is
refused, and its structure goes op by op). The server
charges each as it charges a graph. A session resumed on a new connection keeps its graphs:
nothing to do. The metas of live ids (what a key needs of a segment's inputs) are noted as
handles are made (``client.device.new_handle``) and forgotten as ids are freed.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol import FEATURE_SEGMENTS, Batch, Describe, TensorMeta
from protocol.graphs import GraphDef, GraphTensor, RegisterGraph, renumber
from protocol.messages import Request
from protocol.ops import FromBuffer, RunSegment

from ._pending import Pending
from ._stats import SegmentStats
from ._structure import Structure, structure

SIGHTINGS = 2  # occurrences of a structure before it is registered (see the docstring)
MOST_SIGHTINGS = 256  # what evictions of segments never replayed raise SIGHTINGS to, at most
MOST_SEGMENTS = 32  # registered segments kept (half the server's default --max-graphs)
MOST_SEEN = 1024  # structures counted but not registered, before the count starts over
MOST_NOVEL = 16  # new structures of one outline (op types) before it is no longer keyed
# Shorter segments go op by op: a replay's own costs (its key, its run's setup on the server)
# are about those of so many ops sent alone.
MIN_OPS = 8
ENV = "TENSORWIRE_SEGMENT_REPLAY"  # "0" (or "false", "no", "off") turns segment replay off


def segmenter(
    option: bool | None, features: Sequence[str], new_graph_id: Callable[[], int]
) -> Segmenter | None:
    """A session's segment replay: on if ``option`` says so, or if it is None unless
    :data:`ENV` turns it off; and only with a server that speaks ``segments``."""
    if option is None:
        option = os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")
    return Segmenter(new_graph_id) if option and FEATURE_SEGMENTS in features else None


@dataclass
class _Entry:
    graph_id: int
    confirm_at: int = 0  # the message whose reply confirms the registration (0: not yet sent)
    hits: int = 0


class Segmenter:
    """One connection's segment replay (see the module docstring). Its methods are called
    under the connection's lock, but :meth:`refused` (the reader's) and the metas' updates."""

    def __init__(self, new_graph_id: Callable[[], int], most: int | None = None) -> None:
        self.metas: dict[int, TensorMeta] = {}  # live ids' metas (client.device.new_handle)
        self._new_graph_id = new_graph_id
        self._most = MOST_SEGMENTS if most is None else most
        self._sightings = SIGHTINGS  # raised by evictions of segments never replayed
        self._registered: collections.OrderedDict[object, _Entry] = collections.OrderedDict()
        self._by_graph: dict[int, object] = {}
        # By hash, not by key (a long segment's key is large): a collision costs a count or a
        # replay, never a wrong run, which the registered segments' whole keys decide.
        self._seen: dict[int, int] = {}  # structures not registered: how often seen
        self._outlines: dict[int, int] = {}  # op types seen: how many new structures of them
        self._refused: set[int] = set()  # structures whose registration was refused
        self._refusals: collections.deque[int] = collections.deque()  # from the reader
        self._messages: dict[int, int] = {}  # a registration's own message: its graph id
        self._sending: _Entry | None = None  # the registration flush returned, until sent
        self._whole = True  # no flush without a request since the last one with
        self._stats = {"hits": 0, "misses": 0, "registered": 0, "evicted": 0, "refused": 0}

    def stats(self) -> SegmentStats:
        return SegmentStats(segments=len(self._registered), **self._stats)

    def refused(self, graph_id: int) -> None:
        """The server refused graph ``graph_id`` (the reader thread: applied at the next
        flush, before any run of it could be sent)."""
        self._refusals.append(graph_id)

    def dropped(self, number: int) -> bool:
        """The server could not use message ``number`` at all (``Dropped``, the reader
        thread): True if it was a registration's own, which then never happened (and nothing
        else was lost: it carries nothing else)."""
        graph_id = self._messages.pop(number, None)
        if graph_id is not None:
            self._refusals.append(graph_id)
        return graph_id is not None

    def sent(self, registration: int, last: int) -> None:
        """The registration :meth:`flush` returned is message ``registration``; the flush's
        last message, whose reply confirms it, is ``last``."""
        entry = self._sending
        assert entry is not None
        self._sending, entry.confirm_at = None, last
        self._messages[registration] = entry.graph_id

    def forget(self, frees: Sequence[int]) -> None:
        """The ids ``frees`` were freed: their metas go."""
        metas = self.metas
        for tensor_id in frees:
            metas.pop(tensor_id, None)

    def flush(
        self, batch: Pending, requests: Sequence[Request], answered: int, ack: int
    ) -> Batch | None:
        """Look at the segment ``batch`` ends, flushed with ``requests``; replace its ops by
        one run, or register it: the message to send before ``batch`` (a message of its own,
        carrying ``ack``: one the server cannot take fails nothing else), whose number the
        caller then tells :meth:`sent`. ``answered``: the last message whose reply arrived."""
        while self._refusals:
            self._refuse(self._refusals.popleft())
        for number in [n for n in self._messages if n <= answered]:  # answered: it held
            self._messages.pop(number, None)
        if not requests:  # ops sent without one: the segment they are part of is not whole
            self._whole = self._whole and not batch.ops
            return None
        whole, self._whole = self._whole, True
        if len(batch.ops) < MIN_OPS or not whole:
            return None
        if any(type(r) is Describe for r in requests):  # a data-dependent shape
            return None
        outline = hash((len(batch.ops), *map(type, batch.ops)))
        novel = self._outlines.get(outline)
        if novel is None or novel >= MOST_NOVEL:  # new op types, or ever new structures
            if len(self._outlines) >= MOST_SEEN:
                self._outlines.clear()
            self._outlines.setdefault(outline, 0)
            self._stats["misses"] += 1
            return None
        # list() of a deque that __del__ appends to: one C call that allocates no tracked
        # object, so no finalizer (nor thread) runs within it
        found = structure(batch.ops, list(batch.frees), self.metas)
        if found is None:
            return None
        try:
            digest = hash(found.key)
        except TypeError:  # a field of a type that cannot be a key: not replayed
            return None
        entry = self._registered.get(found.key)
        if entry is not None and 0 < entry.confirm_at <= answered:
            self._registered.move_to_end(found.key)
            self._run(batch, entry, found)
            return None
        self._stats["misses"] += 1
        if entry is not None or digest in self._refused:
            return None
        seen = self._seen.get(digest, 0) + 1
        if seen == 1:
            self._outlines[outline] = novel + 1
        if seen < self._sightings or self._evicted(batch):
            if len(self._seen) >= MOST_SEEN:
                self._seen.clear()
            self._seen[digest] = seen
            return None
        self._seen.pop(digest, None)
        return self._register(batch, found, ack)

    def _evicted(self, batch: Pending) -> bool:
        """Drop the least recently used segment if none more may be registered (the
        registration waits for the next sighting: a batch's drops apply after its
        registrations)."""
        if len(self._registered) < self._most:
            return False
        key, entry = self._registered.popitem(last=False)
        del self._by_graph[entry.graph_id]
        if not entry.hits:  # registered for nothing: structures recur too seldom to keep
            self._sightings = min(2 * self._sightings, MOST_SIGHTINGS)
        batch.drops.append(entry.graph_id)
        self._stats["evicted"] += 1
        return True

    def _register(self, batch: Pending, found: Structure, ack: int) -> Batch | None:
        graph = self._graph(batch, found)
        if graph is None:
            return None
        entry = self._sending = _Entry(self._new_graph_id())
        self._registered[found.key] = entry
        self._by_graph[entry.graph_id] = found.key
        self._stats["registered"] += 1
        return Batch(graphs=[RegisterGraph(graph_id=entry.graph_id, graph=graph)], ack=ack)

    def _graph(self, batch: Pending, found: Structure) -> GraphDef | None:
        """The segment as a graph: its inputs numbered from 0, a made id ``i`` numbered
        ``len(args) + i - base`` (``base``: the lowest made id), its outputs the made ids the
        client holds (``protocol.ops.RunSegment``)."""
        count, base = len(found.args), min(found.made)
        ids = {tensor_id: number for number, tensor_id in enumerate(found.args)}
        ids.update({i: count + i - base for i in found.made})
        kept = sorted(i for i in found.made if i not in found.freed)
        try:
            inputs = [_tensor(f"in{n}", n, self.metas[i]) for n, i in enumerate(found.args)]
            outputs = [_tensor(f"t{i - base}", ids[i], self.metas[i]) for i in kept]
        except KeyError:  # a made id without a handle: not a segment to replay
            return None
        ops = [renumber(op, ids) for op in batch.ops if type(op) is not FromBuffer]
        return GraphDef.model_construct(inputs=inputs, outputs=outputs, ops=ops)  # ops checked

    def _run(self, batch: Pending, entry: _Entry, found: Structure) -> None:
        run = RunSegment(
            graph=entry.graph_id, out=min(found.made), args=found.args, scalars=found.scalars
        )
        batch.ops[:] = [*(batch.ops[i] for i in found.uploads), run]
        entry.hits += 1
        self._stats["hits"] += 1

    def _refuse(self, graph_id: int) -> None:
        key = self._by_graph.pop(graph_id, None)
        if key is not None:
            self._registered.pop(key, None)
            if len(self._refused) >= MOST_SEEN:
                self._refused.clear()
            self._refused.add(hash(key))
            self._stats["refused"] += 1


def _tensor(name: str, number: int, meta: TensorMeta) -> GraphTensor:
    return GraphTensor(name=name, id=number, shape=meta.shape, dtype=meta.dtype)
