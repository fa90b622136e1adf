"""What Python's own protocols do with a remote array: ``format``, ``copy`` and ``pickle``.

- ``format(x, spec)`` formats a 0-d array's value as numpy formats a 0-d array (one read);
  an n-d array takes only the empty spec (``str(x)``), as numpy's n-d arrays do.
- ``copy.copy(x)`` and ``copy.deepcopy(x)`` are a new array on the same device, copied there:
  nothing is downloaded.
- ``pickle.dumps(x)`` reads the values and pickles them as numpy pickles the same
  ``np.ndarray``: a pickle cannot carry a live session, so it unpickles, anywhere, as a numpy
  array with ``x``'s values, dtype and shape (``xp.asarray`` puts it back on a device).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .array import RemoteArray


class PythonProtocols:
    """Mixed into :class:`~client.array.RemoteArray`."""

    __slots__ = ()

    def __format__(self: RemoteArray, format_spec: str) -> str:  # type: ignore[misc]
        if self.ndim == 0:
            return format(self.numpy(), format_spec)
        return object.__format__(self, format_spec)

    def __copy__(self: RemoteArray) -> RemoteArray:  # type: ignore[misc]
        return self.copy()

    def __deepcopy__(self: RemoteArray, memo: dict[int, Any]) -> RemoteArray:  # type: ignore[misc]
        return self.copy()

    def __reduce_ex__(self: RemoteArray, protocol: Any) -> Any:  # type: ignore[misc]
        values: np.ndarray[Any, Any] = self.numpy()
        return values.__reduce_ex__(protocol)
