"""One way for a test to wait for state it cannot be told about: poll it.

Prefer an event where the code offers one (a reply, a closed connection, a line on the server's
stderr: :meth:`server.process.OutputTail.wait_for`); poll only state that lives in another
process or thread, such as a server's byte count or a gauge.
"""

from __future__ import annotations

import time
from collections.abc import Callable

INTERVAL = 0.02  # seconds between two looks


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Return once ``condition()`` is true; ``what`` names it for the failure.

    Raises:
        AssertionError: still false after ``timeout`` seconds (checked once more at the end).
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(INTERVAL)
