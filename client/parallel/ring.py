"""The ring all-reduce: the weighted sum of one vector per replica, each on its own device,
left on every replica with the same bits.

The ring has two halves over N chunks of the vector. The reduce-scatter (N - 1 steps): chunk
``c`` is summed along the ring from replica ``c`` and ends complete on replica ``c - 1``, its
owner. The all-gather (N - 1 steps): each owner's sum is copied around the ring. Each sum is
computed once, by its owner, and only its bytes travel after, so every replica ends with the
same bits; a sum recomputed in another order on another replica could differ in the last
place, and the replicas would drift apart. Each half moves N(N - 1) chunks of 1/N of the
vector, each by ``x.to_device(device)`` (the Array API standard's, so whatever a move costs,
through the client or server to server, is what the ring costs): per replica and step one
chunk out and one in, the ring's balanced load on every link.

Only the standard's array methods and functions are called (``__array_namespace__``,
``to_device``, slicing, ``*``, ``+``, ``concat``): any namespace whose arrays can move to each
other's devices works (a server's, numpy's, ``array_api_strict``'s devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def all_reduce_mean(vectors: Sequence[Any], weights: Sequence[float] | None = None) -> list[Any]:
    """The weighted sum ``sum(weights[r] * vectors[r])`` of 1-D arrays of one length and
    dtype, one per replica, each on its replica's device, by a ring all-reduce: a new array on
    each replica's device, the same bits on all. ``weights`` are 1/N each by default (the
    mean); each vector is scaled by its weight on its own device before the ring.

    Raises:
        ValueError: no vectors, a vector not 1-D, lengths that differ, or as many weights as
            there are not vectors.
    """
    count = len(vectors)
    if count == 0:
        raise ValueError("all_reduce_mean: no vectors")
    shares = [1.0 / count] * count if weights is None else [float(w) for w in weights]
    if len(shares) != count:
        raise ValueError(f"all_reduce_mean: {len(shares)} weights for {count} vectors")
    lengths = {tuple(v.shape) for v in vectors}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise ValueError(f"all_reduce_mean: the vectors must be 1-D of one length, not {lengths}")
    (length,) = next(iter(lengths))
    bounds = [c * length // count for c in range(count + 1)]  # N chunks, sizes within 1
    # chunks[r][c]: chunk c as replica r holds it
    scaled = [vector * share for vector, share in zip(vectors, shares, strict=True)]
    chunks = [[v[bounds[c] : bounds[c + 1]] for c in range(count)] for v in scaled]
    devices = [vector.device for vector in vectors]
    _reduce_scatter(chunks, devices)
    _all_gather(chunks, devices)
    return [
        vector.__array_namespace__().concat(held)
        for vector, held in zip(vectors, chunks, strict=True)
    ]


def _reduce_scatter(chunks: list[list[Any]], devices: list[Any]) -> None:
    """At step s replica r sends its partial sum of chunk (r - s) to replica r + 1, which adds
    its own: after N - 1 steps, replica r holds the whole sum of chunk (r + 1), added up in
    ring order from replica r + 1 round to r, its last addition made there and nowhere else."""
    count = len(chunks)
    for step in range(count - 1):
        # Every move of a step is taken before any sum replaces a chunk: a step's moves are
        # independent of each other, as the ring's simultaneous sends are.
        moves = [(r, (r - step) % count) for r in range(count)]
        moved = [chunks[r][c].to_device(devices[(r + 1) % count]) for r, c in moves]
        for (r, c), incoming in zip(moves, moved, strict=True):
            target = (r + 1) % count
            chunks[target][c] = incoming + chunks[target][c]


def _all_gather(chunks: list[list[Any]], devices: list[Any]) -> None:
    """At step s replica r passes chunk (r + 1 - s) on to replica r + 1, which takes it in
    place of its own partial sum: after N - 1 steps every replica holds every owner's sum,
    each a byte copy of what its owner computed."""
    count = len(chunks)
    for step in range(count - 1):
        moves = [(r, (r + 1 - step) % count) for r in range(count)]
        moved = [chunks[r][c].to_device(devices[(r + 1) % count]) for r, c in moves]
        for (r, c), incoming in zip(moves, moved, strict=True):
            chunks[(r + 1) % count][c] = incoming
