"""The settings of a client's connection to a server, in one frozen object built once by the
device (or by a server's pulls, ``server/peers.py``) and passed down to the connection, the
upgrade and the keeper thread.

Users set them as keyword arguments of :class:`~client.RemoteDevice`,
``AsyncRemoteDevice.connect`` and :func:`~client.open_device`, typed by
:class:`ConnectionKeywords`; ``RemoteDevice``'s docstring documents them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from ._buffers import POOL_BYTES
from ._liveness import PING_INTERVAL, PING_TIMEOUT, Liveness
from ._resuming import BACKOFF_FIRST, BACKOFF_MAX, RECONNECT_ATTEMPTS, RECONNECT_TIMEOUT, Backoff

OPEN_TIMEOUT = 10.0  # seconds to connect, upgrade and be welcomed


class ConnectionKeywords(TypedDict, total=False):
    """The keyword arguments that set a device's connection (beside its ``token``): the
    :class:`ConnectionOptions` fields of the same names."""

    open_timeout: float
    ca_file: str | None
    timeout: float | None
    ping_interval: float | None
    ping_timeout: float | None
    reconnect_attempts: int
    reconnect_timeout: float
    reconnect_backoff: float
    reconnect_backoff_max: float
    segment_replay: bool | None
    sync: bool | None
    origins: bool | None


@dataclass(frozen=True)
class ConnectionOptions:
    """How a client connects to a server and watches it: ``token`` (sent as
    ``Authorization: Bearer TOKEN``; None sends none), ``open_timeout``, ``ca_file`` and the
    liveness bounds ``timeout``, ``ping_interval`` and ``ping_timeout`` are ``RemoteDevice``'s
    parameters of the same names, as are the reconnection bounds (``reconnect_attempts``,
    ``reconnect_timeout``, ``reconnect_backoff`` and ``reconnect_backoff_max``: see
    :class:`~client._resuming.Backoff`). ``pool_bytes`` bounds the received buffers kept for reuse
    (``client._buffers``); a server's pulls keep none (0). ``bounded_replies``: every message
    that carries bytes must answer a request that said how many it may carry
    (``Connection.request``'s ``most_bytes``), else it is refused before its buffers exist: a
    server's pulls, whose peer may lie about a reply's size.

    Raises:
        ValueError: a liveness bound that is not a positive number.
    """

    token: str | None = field(default=None, repr=False)  # a secret: never in a repr or a log
    open_timeout: float = OPEN_TIMEOUT
    ca_file: str | None = None
    timeout: float | None = None
    ping_interval: float | None = PING_INTERVAL
    ping_timeout: float | None = PING_TIMEOUT
    pool_bytes: int = POOL_BYTES
    bounded_replies: bool = False
    reconnect_attempts: int = RECONNECT_ATTEMPTS
    reconnect_timeout: float = RECONNECT_TIMEOUT
    reconnect_backoff: float = BACKOFF_FIRST
    reconnect_backoff_max: float = BACKOFF_MAX
    # replay repeated segments (client._segments); None: unless TENSORWIRE_SEGMENT_REPLAY=0
    segment_replay: bool | None = None
    # wait for every op, so that a failed op raises at the line that made it
    # (client._origins); None: if TENSORWIRE_SYNC=1
    sync: bool | None = None
    # note where user code made each op, for its error (client._origins); None: if
    # TENSORWIRE_ORIGINS=1
    origins: bool | None = None

    def __post_init__(self) -> None:
        self.liveness  # noqa: B018 - checks the bounds before anything connects
        self.backoff  # noqa: B018 - likewise the reconnection bounds

    @property
    def backoff(self) -> Backoff:
        """When the connection tries again after losing the server (attempts and their delays)."""
        return Backoff(
            self.reconnect_attempts,
            self.reconnect_timeout,
            self.reconnect_backoff,
            self.reconnect_backoff_max,
        )

    @property
    def liveness(self) -> Liveness:
        """The bounds the connection's keeper thread watches the server within."""
        return Liveness(self.ping_interval, self.ping_timeout, self.timeout)


DEFAULT_OPTIONS = ConnectionOptions()
