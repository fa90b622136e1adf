"""Pulls from peer servers: the network side of the ``pull`` op (``server/pulls.py``).

A pull's source is another Tensorwire server, and this server is its client: it opens a session
with the client's own connection (``client._connection``: the same upgrade, TLS, handshake,
typed refusals, keepalive and fast receive path as training code gets, rather than a second
implementation of them in the server), presenting its peer credentials (``--peer-token``, by
default its own ``--token``: servers that share one secret authenticate to each other) and
checking a ``wss://`` source's certificate against ``--peer-ca-file`` or the system's CAs;
sends one :class:`~protocol.Claim` with the capability and receives the tensor as a read reply,
straight into memory that the pulled tensor then keeps (the session keeps no receive buffers).
The pull reserved the claimed tensor's bytes before it was sent, and a reply that declares more
(or a message with bytes that answers no claim) is refused once its header is read, before
anything is allocated for it, and the session with that source is closed: a lying source costs
the pulling server no memory beyond the reservation (``client._receiving``).
One session per source is kept and shared by every pull from it (opening one, the upgrade and
the handshake, costs more than a small pull: bench/REASONS.md, 'Kept peer sessions'), renewed
once when it has ended (the source's idle timeout, a restart) and closed when the server stops.
It imports the client only when a pull runs (the one import of ``client`` from ``server``,
named in the import contract). A source is contacted only if it matches ``--peers``: otherwise
a client could make the server connect anywhere its network reaches.

Failures are the op's, never the session's: each raises :class:`StoreError` with
``transfer_failed`` (no credentials for the source, refused, unreachable, lost midway, or
silent past the keepalive) or the source's own code (``capability_refused``), naming the source.
"""

from __future__ import annotations

import collections
import math
import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import Claim, ErrorCode
from protocol.dtypes import itemsize
from protocol.ops import Pull

from .config import ServerConfig
from .errors import StoreError, let_go_of_frames
from .peer_urls import PeerPatterns, canonical

if TYPE_CHECKING:
    from client._connection import Connection

OPEN_TIMEOUT = 10.0  # seconds to connect and be welcomed
PING_INTERVAL, PING_TIMEOUT = 5.0, 10.0  # a source silent this long is lost
# Seconds a claim's reply may take: 2 GiB (the largest message) at 20 MB/s. A source that
# answers pings but never the claim holds the pull, and its pull thread (server/workers.py), this
# long at most.
PULL_TIMEOUT = 120.0
KEPT_SESSIONS = 32  # sessions with peers kept open at once; the least recently used closes
CREDENTIALS_HINT = " (a server presents its --peer-token, by default its --token)"


class PeerFetcher:
    """Fetches pulled tensors from the peers ``config`` allows, with its credentials."""

    def __init__(self, config: ServerConfig) -> None:
        self.peers = PeerPatterns(config.peers)
        self._token = config.credentials
        self._ca_file = None if config.peer_ca_file is None else str(config.peer_ca_file)
        # one kept session per source (by canonical URL), shared, least recently used first
        self._sessions: collections.OrderedDict[str, Connection] = collections.OrderedDict()
        self._lock = threading.Lock()

    def allows(self, source: str) -> bool:
        return self.peers.match(source) is not None

    def __call__(self, op: Pull, claimant: str) -> np.ndarray[Any, Any]:
        """The array behind ``op.capability`` at ``op.source``, claimed as ``claimant``.

        Raises:
            StoreError: ``transfer_failed``, or the source's refusal (``capability_refused``).
        """
        assert op.source is not None, "a pull from this server is not fetched"
        source, parts = op.source, self.peers.match(op.source)
        if parts is None:
            allowed = ", ".join(self.peers.patterns) or "none: --peers is empty"
            raise _failed(
                f"this server has no credentials for {source}: it pulls only from its --peers "
                f"({allowed})"
            )
        try:
            return self._fetch(op, canonical(parts), claimant)
        except Exception as exc:  # noqa: BLE001 - a pull fails as an op, never the session
            let_go_of_frames(exc)  # they hold the claim's reply and connection, which hold exc
            if isinstance(exc, StoreError):
                raise
            raise _failed(f"the pull from {source} failed: {type(exc).__name__}: {exc}") from None

    def _fetch(self, op: Pull, url: str, claimant: str) -> np.ndarray[Any, Any]:
        from client.errors import ConnectionLost, RemoteError

        source = op.source
        reserved = math.prod(op.shape) * itemsize(op.dtype)  # what the pull reserved for it
        for attempt in (1, 2):
            conn = self._session(url, source)
            try:
                claim = conn.request(partial(_claim, op=op, claimant=claimant), reserved)
            except ConnectionLost as exc:  # the kept session had ended: the claim was not sent
                self._forget(url, conn)
                if attempt == 1:
                    continue
                raise _failed(f"cannot reach {source}: {exc}") from None
            try:
                array: np.ndarray[Any, Any] = claim.result()
            except RemoteError as exc:
                message = f"{source} refused the claim: {exc.error.message}"
                raise StoreError(exc.code, message) from None
            except ConnectionLost as exc:
                self._forget(url, conn)
                if attempt == 1 and exc.code is ErrorCode.IDLE_TIMEOUT:
                    continue  # closed for idleness as the claim came: the source never read it
                raise _failed(f"the pull from {source} was cut off: {exc}") from None
            return array
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _session(self, url: str, source: str | None) -> Connection:
        """The kept session with ``url``, opened if there is none (outside the lock: a slow
        source delays only its own pulls)."""
        with self._lock:
            conn = self._sessions.get(url)
            if conn is not None:
                self._sessions.move_to_end(url)
                return conn
        from client._connection import Connection
        from client._options import ConnectionOptions
        from client.errors import ConnectionLost, HandshakeError, VersionMismatchError

        options = ConnectionOptions(
            token=self._token,
            open_timeout=OPEN_TIMEOUT,
            ca_file=self._ca_file,
            timeout=PULL_TIMEOUT,
            ping_interval=PING_INTERVAL,
            ping_timeout=PING_TIMEOUT,
            pool_bytes=0,  # a pulled tensor's memory is the store's, counted: none kept beside
            bounded_replies=True,  # bytes only in reply to a claim, and no more than it asked
        )
        try:
            conn = Connection(url, 0, options)
        except HandshakeError as exc:
            hint = "" if isinstance(exc, VersionMismatchError) else CREDENTIALS_HINT
            raise _failed(f"{source} refused this server's session: {exc}{hint}") from None
        except (ConnectionLost, OSError, ValueError) as exc:
            raise _failed(f"cannot reach {source}: {exc}") from None
        with self._lock:
            kept = self._sessions.setdefault(url, conn)
            evicted = []
            while len(self._sessions) > KEPT_SESSIONS:
                evicted.append(self._sessions.popitem(last=False)[1])
        for each in [*evicted, *([conn] if kept is not conn else [])]:
            each.close()  # the least recently used; or ours, if another pull opened one first
        return kept

    def _forget(self, url: str, conn: Connection) -> None:
        with self._lock:
            if self._sessions.get(url) is conn:
                del self._sessions[url]
        conn.close()

    def close(self) -> None:
        """Close every kept session (the server is stopping)."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for conn in sessions:
            conn.close()


def _claim(request_id: int, op: Pull, claimant: str) -> Claim:
    return Claim(
        request_id=request_id,
        capability=op.capability,
        claimant=claimant,
        shape=op.shape,
        dtype=op.dtype,
    )


def _failed(message: str) -> StoreError:
    return StoreError(ErrorCode.TRANSFER_FAILED, message)
