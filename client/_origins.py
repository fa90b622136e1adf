"""Where user code made each op: so that a failed op's error names the user's line.

Ops run later, on the server; their errors surface at a read, far from the line that made
the op. With the notes on, each op's output handle notes, as it is made
(``client.device.new_handle``), the first frame outside the SDK's packages (``client``,
``protocol``): its code object and its last instruction, which cost nothing to keep; the line
is looked up, and the message written, only when an error is raised (:meth:`Origins.explain`).
The notes of one session are a ring of :data:`MOST` entries indexed by tensor id: the ids are
allocated in order, so an entry lives until :data:`MOST` ops later (an op that failed that
long before its read is named by its op only), and the ring costs a fixed amount of memory
whatever the session does.

Off by default: finding that frame costs a frame object for each SDK frame above the op
(several for an autodiff op), far more than the few percent of an op's building that an
always-on feature may take (``bench/cpu.py`` measures it). ``TENSORWIRE_ORIGINS=1`` (or
``RemoteDevice(..., origins=True)``) turns them on; ``TENSORWIRE_SYNC=1`` (``sync=True``)
instead waits for every op as it is made, so that its error raises at its line. A failed op's
error read without the notes says so.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from concurrent.futures import Future
from types import CodeType
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import RemoteError

if TYPE_CHECKING:
    from .device import Device

MOST = 1 << 14  # ops whose origin a session keeps (a power of two: an id masks to its slot)
_MASK = MOST - 1
ENV = "TENSORWIRE_ORIGINS"  # "1" (or "true", "yes", "on") turns the notes on
SYNC_ENV = "TENSORWIRE_SYNC"  # "1" (or "true", "yes", "on"): every op waited for as it is made

# The SDK's packages: a frame whose file lies in one is not the user's
_PACKAGES = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (__file__, sys.modules["protocol"].__file__ or "")
)
# Each file seen: whether it is the SDK's (the same code's file name is the same str object,
# so a hit costs a dict lookup by identity)
_sdk_files: dict[str, bool] = {}
_getframe = sys._getframe
# Frames above :meth:`Origins.note` that are the SDK's on every path that notes (the noting
# function, the one that made the handle, the public function that called it): skipped
# without a look, since each frame looked at costs a frame object
SKIP = 3
HINT = (
    "To find the line that made the failed op: TENSORWIRE_ORIGINS=1 names it in this error, "
    "TENSORWIRE_SYNC=1 raises the error there (both slow every op)"
)
_OUTPUT_ID = re.compile(r"-> #(\d+)")


def switched_on(name: str) -> bool:
    """Whether the environment variable ``name`` says "1" (or "true", "yes", "on")."""
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


class Origins:
    """One session's notes: tensor id -> the user frame's code and instruction that made it."""

    __slots__ = ("_ids", "_codes", "_lasti", "on")

    def __init__(self, on: bool | None = None) -> None:
        self.on = switched_on(ENV) if on is None else on
        self._ids = [0] * MOST
        self._codes: list[CodeType | None] = [None] * MOST
        self._lasti = [0] * MOST

    def note(self, tensor_id: int) -> None:
        """Note the first frame outside the SDK as the maker of ``tensor_id`` (the caller
        tests :attr:`on` first)."""
        frame = _getframe(SKIP)
        files = _sdk_files
        while True:
            code = frame.f_code
            name = code.co_filename
            sdk = files.get(name)
            if sdk is None:
                sdk = files[name] = os.path.abspath(name).startswith(_PACKAGES)
            if not sdk:
                break
            back = frame.f_back
            if back is None:
                return
            frame = back
        slot = tensor_id & _MASK
        self._ids[slot] = tensor_id
        self._codes[slot] = code
        self._lasti[slot] = frame.f_lasti

    def where(self, tensor_id: int) -> str | None:
        """``FILE, line N, in FUNCTION`` and the line's source, for ``tensor_id``'s maker, or
        None if it was not noted (or no longer is)."""
        slot = tensor_id & _MASK
        code = self._codes[slot]
        if code is None or self._ids[slot] != tensor_id:
            return None
        line = _line_of(code, self._lasti[slot])
        text = linecache.getline(code.co_filename, line).strip() if line else ""
        where = f'File "{code.co_filename}", line {line}, in {code.co_name}'
        return f"{where}\n    {text}" if text else where

    def explain(self, error: BaseException) -> None:
        """Add to ``error`` (a :class:`RemoteError` for a failed op) a note naming the line of
        user code that made the op, and set its ``origin`` to it (once: an error raised again
        keeps its note)."""
        if not isinstance(error, RemoteError) or error.op is None or error.origin is not None:
            return
        if not self.on:
            if not getattr(error, "__notes__", None):
                error.add_note(HINT)
            return
        found = _OUTPUT_ID.search(error.op)
        where = None if found is None else self.where(int(found.group(1)))
        if where is not None:
            error.origin = where
            error.add_note(f"The failed op was made at\n  {where}")


def _line_of(code: CodeType, lasti: int) -> int | None:
    """The line of the instruction at byte offset ``lasti`` in ``code``."""
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return None


def read_values(device: Device, tensor_id: int) -> np.ndarray[Any, Any]:
    """The values of ``tensor_id`` on ``device`` (one read); a failed op's error says where it
    was made (:meth:`Origins.explain`)."""
    return values_of(device, device.submit_read(tensor_id))


def values_of(device: Device, read: Future[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """What the read ``read`` on ``device`` returns; a failed op's error says where it was
    made (:meth:`Origins.explain`)."""
    try:
        return read.result()
    except RemoteError as error:
        device.origins.explain(error)
        raise


def wait_for(device: Device, tensor_id: int) -> None:
    """Wait until the op that makes ``tensor_id`` on ``device`` has run (``sync``: its error
    raises at the line that made it, which the traceback names); not inside a capture, whose
    ops are recorded to run as a graph (``client.capture``), which may not wait for one.

    Raises:
        RemoteError: it failed, or one it depends on did.
    """
    if getattr(device, "_capturing", None) is not None:
        return
    try:
        device.describe([tensor_id])
    except RemoteError as error:
        if device.origins.on:
            device.origins.explain(error)
        raise
