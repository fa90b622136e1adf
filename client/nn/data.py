"""``DataLoader``: batches of arrays that live on a device, gathered there, in PyTorch's idiom.

::

    x, y = ad.asarray(x_train), ad.asarray(y_train)      # uploaded once
    loader = nn.DataLoader(x, y, batch_size=64, shuffle=True, seed=0, drop_last=True)
    for epoch in range(10):
        for xb, yb in loader:                            # gathered on the server
            loss = nn.cross_entropy(model(xb), yb)

Each batch is the rows its indices name, gathered on the arrays' device by ``take``: nothing
is downloaded, and a batch's only upload is its indices (a few hundred bytes). The indices
travel as an upload even when they are consecutive, so that every step sends the same ops
(segment replay and ``jit`` see one structure, whatever the batch's place in the epoch).

``shuffle``: each pass (each ``iter()``) takes a new order drawn by the loader's numpy
generator, seeded by ``seed`` (or pass ``generator=``, a ``numpy.random.Generator`` the
caller keeps, for example to checkpoint its state): one seed gives one sequence of epochs.
Without it the rows come in order.

``drop_last``: a last batch smaller than ``batch_size`` is dropped, so that every batch has
the same shape (what ``client.capture.jit`` needs to replay one graph: a batch of another
shape is recorded as a graph of its own). Without it the last batch holds the rows left.

Over any namespace's arrays (remote arrays, autodiff tensors, numpy arrays): it calls only
the standard's ``asarray`` and ``take`` of the first array's namespace.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np


class DataLoader:
    """Batches of the rows of ``arrays`` (same first dimension), gathered on their device
    (see the module docstring). Iterating yields the batch of each array as a tuple, or the
    batch itself for one array; ``len()`` is the number of batches a pass yields.

    Raises:
        ValueError: no array, arrays of different lengths, a 0-d array, or a ``batch_size``
            under 1.
    """

    def __init__(
        self,
        *arrays: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int | None = None,
        generator: np.random.Generator | None = None,
        drop_last: bool = False,
    ) -> None:
        if not arrays:
            raise ValueError("DataLoader needs at least one array")
        if any(len(a.shape) == 0 for a in arrays):
            raise ValueError("DataLoader batches along the first axis: a 0-d array has none")
        lengths = {int(a.shape[0]) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"arrays of different lengths {sorted(lengths)} along axis 0")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        if generator is not None and seed is not None:
            raise ValueError("pass seed or generator, not both")
        self.arrays = arrays
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.generator = generator if generator is not None else np.random.default_rng(seed)
        self.rows = lengths.pop()
        self._xp = arrays[0].__array_namespace__()

    def __len__(self) -> int:
        if self.drop_last:
            return self.rows // self.batch_size
        return math.ceil(self.rows / self.batch_size)

    def batch_indices(self) -> Iterator[np.ndarray[Any, Any]]:
        """The row indices of each batch of one pass (a new order per pass when shuffling),
        as numpy arrays: for a step that gathers its batch itself."""
        order = self.generator.permutation(self.rows) if self.shuffle else np.arange(self.rows)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield order[start : start + self.batch_size]

    def __iter__(self) -> Iterator[Any]:
        xp = self._xp
        for rows in self.batch_indices():
            index = xp.asarray(rows)
            batch = tuple(xp.take(a, index, axis=0) for a in self.arrays)
            yield batch[0] if len(batch) == 1 else batch

    def __repr__(self) -> str:
        return (
            f"DataLoader({len(self.arrays)} arrays of {self.rows} rows, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle}, drop_last={self.drop_last})"
        )
