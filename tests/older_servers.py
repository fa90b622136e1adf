"""A server that predates a protocol feature, as a client sees it: the real server's welcome
without that feature, so the client speaks to it as to an older release."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from client import _connection


def without_feature(monkeypatch: pytest.MonkeyPatch, feature: str) -> None:
    """Devices opened from now on (within ``monkeypatch``) see welcomes without ``feature``."""
    real: Callable[..., Any] = _connection.handshake

    def older(*args: Any, **kwargs: Any) -> Any:
        welcome = real(*args, **kwargs)
        features = [f for f in welcome.features if f != feature]
        return welcome.model_copy(update={"features": features})

    monkeypatch.setattr(_connection, "handshake", older)
