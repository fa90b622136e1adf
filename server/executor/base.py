"""What every runner shares: its signature.

A runner takes a checked op, the arrays of its inputs (``op.inputs()``, in order) and the
buffers of the message it came in (for uploads), and returns one array per output (or the
array, for one output). It never writes into an input array (``indexing.setitem`` alone may,
when the session says the target is its own; ``elementwise.into_input`` writes into the input
a replay binds it to, one that dies at that op: ``server/elision.py``). Each family module
lists its runners in ``RUNNERS``, by op type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from protocol import TensorMeta
from protocol.codec import Buffer

Array = np.ndarray[Any, Any]
Runner = Callable[[Any, Sequence[Array], Sequence[Buffer]], Array | tuple[Array, ...]]
# What an op allocates beside its result, in bytes, given its result and its inputs (arrays,
# or arrays of their shapes and dtypes only): a family's ``SCRATCH``, ``executor.scratch``
Scratch = Callable[[Any, TensorMeta, Sequence[Array]], int]
