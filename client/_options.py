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

OPEN_TIMEOUT = 10.0  # seconds to connect, upgrade and be welcomed


class ConnectionKeywords(TypedDict, total=False):
    """The keyword arguments that set a device's connection (beside its ``token``): the
    :class:`ConnectionOptions` fields of the same names."""

    open_timeout: float
    ca_file: str | None
    timeout: float | None
    ping_interval: float | None
    ping_timeout: float | None


@dataclass(frozen=True)
class ConnectionOptions:
    """How a client connects to a server and watches it: ``token`` (sent as
    ``Authorization: Bearer TOKEN``; None sends none), ``open_timeout``, ``ca_file`` and the
    liveness bounds ``timeout``, ``ping_interval`` and ``ping_timeout`` are ``RemoteDevice``'s
    parameters of the same names. ``pool_bytes`` bounds the received buffers kept for reuse
    (``client._buffers``); a server's pulls keep none (0).

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

    def __post_init__(self) -> None:
        self.liveness  # noqa: B018 - checks the bounds before anything connects

    @property
    def liveness(self) -> Liveness:
        """The bounds the connection's keeper thread watches the server within."""
        return Liveness(self.ping_interval, self.ping_timeout, self.timeout)


DEFAULT_OPTIONS = ConnectionOptions()
