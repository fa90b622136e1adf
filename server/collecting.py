"""Collecting the reference cycles that closed connections leave: websockets' protocol object
and its parser, the connection's own objects. The server collects rarely (its thresholds,
``server/__main__.py``), so a lost connection asks for a collection of the young generations
(``gc.collect(1)``) instead; one collection serves every connection lost within
:data:`COLLECT_AFTER` of the first, since each walks every young object of the server, a large
batch in flight among them, holding the event loop (bench/REASONS.md, 'Collecting closed
connections').
"""

from __future__ import annotations

import asyncio
import gc
import weakref

COLLECT_AFTER = 0.5  # seconds from a connection's loss to the collection that serves it

_pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.TimerHandle] = (
    weakref.WeakKeyDictionary()
)


def collect_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Collect the young generations within :data:`COLLECT_AFTER`, once for all the
    connections lost meanwhile."""
    if loop not in _pending:
        _pending[loop] = loop.call_later(COLLECT_AFTER, _collect, loop)


def _collect(loop: asyncio.AbstractEventLoop) -> None:
    _pending.pop(loop, None)
    gc.collect(1)


__all__ = ["COLLECT_AFTER", "collect_soon"]
