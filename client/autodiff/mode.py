"""Whether operations are recorded for differentiation: on by default, off inside ``no_grad()``.

The switch is a context variable, so it is per thread and per asyncio task, as PyTorch's grad
mode is per thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_recording: ContextVar[bool] = ContextVar("tensorwire_autodiff_recording", default=True)


def is_grad_enabled() -> bool:
    """True when new operations are recorded (outside every ``no_grad()``)."""
    return _recording.get()


@contextmanager
def no_grad() -> Iterator[None]:
    """Record nothing inside: results require no gradient (evaluation, optimizer updates)."""
    token = _recording.set(False)
    try:
        yield
    finally:
        _recording.reset(token)


@contextmanager
def enable_grad() -> Iterator[None]:
    """Record again inside a ``no_grad()`` block."""
    token = _recording.set(True)
    try:
        yield
    finally:
        _recording.reset(token)
