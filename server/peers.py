"""Pulls from peer servers: the network side of the ``pull`` op (``server/pulls.py``).

A pull's source is another Tensorwire server, and this server is its client: it opens a session
with the client's own connection (``client._connection``: the same upgrade, TLS, handshake,
typed refusals, keepalive and fast receive path as training code gets, rather than a second
implementation of them in the server), presenting its peer credentials (``--peer-token``, by
default its own ``--token``: servers that share one secret authenticate to each other) and
checking a ``wss://`` source's certificate against ``--peer-ca-file`` or the system's CAs;
sends one :class:`~protocol.Claim` with the capability and receives the tensor as a read reply,
straight into memory that the pulled tensor then keeps (the session keeps no receive buffers).
One session per source is kept and shared by every pull from it (opening one costs about 5 ms:
the upgrade and the handshake), renewed once when it has ended (the source's idle timeout, a
restart) and closed when the server stops. It imports the client only when a pull
runs (the one import of ``client`` from ``server``, named in the import contract). A source is
contacted only if it matches ``--peers``: otherwise a client could make the server connect
anywhere its network reaches.

Failures are the op's, never the session's: each raises :class:`StoreError` with
``transfer_failed`` (no credentials for the source, refused, unreachable, lost midway, or
silent past the keepalive) or the source's own code (``capability_refused``), naming the source.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import Claim, ErrorCode
from protocol.ops import Pull

from .config import ServerConfig
from .errors import StoreError

if TYPE_CHECKING:
    from client._connection import Connection

# scheme://host[:port][/], nothing else: no user name (``ws://peer@evil``), no path or query.
# A pattern's host labels and port may be shell-style wildcards; a source's may not.
URL_PARTS = re.compile(r"^(wss?)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.*?-]+)(?::([0-9]+|\*))?/?$")
DEFAULT_PORTS = {"ws": "80", "wss": "443"}
OPEN_TIMEOUT = 10.0  # seconds to connect and be welcomed
PING_INTERVAL, PING_TIMEOUT = 5.0, 10.0  # a source silent this long is lost


class PeerFetcher:
    """Fetches pulled tensors from the peers ``config`` allows, with its credentials."""

    def __init__(self, config: ServerConfig) -> None:
        self.patterns = config.peers
        self._token = config.credentials
        self._ca_file = None if config.peer_ca_file is None else str(config.peer_ca_file)
        self._sessions: dict[str, Connection] = {}  # one kept session per source, shared
        self._lock = threading.Lock()

    def allows(self, source: str) -> bool:
        """Whether ``source`` is one of the peers: its scheme the same, each label of its
        host matched by the pattern's label (a ``*`` never spans a dot), its port too."""
        parts = url_parts(source)
        if parts is None or any(c in "*?[" for c in parts[1] + parts[2]):
            return False
        return any(_matches(parts, url_parts(pattern)) for pattern in self.patterns)

    def __call__(self, op: Pull, claimant: str) -> np.ndarray[Any, Any]:
        """The array behind ``op.capability`` at ``op.source``, claimed as ``claimant``.

        Raises:
            StoreError: ``transfer_failed``, or the source's refusal (``capability_refused``).
        """
        source = op.source
        assert source is not None, "a pull from this server is not fetched"
        if not self.allows(source):
            allowed = ", ".join(self.patterns) or "none: --peers is empty"
            raise StoreError(
                ErrorCode.TRANSFER_FAILED,
                f"this server has no credentials for {source}: it pulls only from its --peers "
                f"({allowed})",
            )
        from client.errors import ConnectionLost, RemoteError

        for attempt in (1, 2):
            conn = self._session(source)
            try:
                claim = conn.request(
                    lambda rid: Claim(request_id=rid, capability=op.capability, claimant=claimant)
                )
            except ConnectionLost as exc:  # the kept session ended before (idle, a restart)
                self._forget(source, conn)
                if attempt == 2:
                    raise _failed(f"cannot reach {source}: {exc}") from None
                continue  # the claim was never sent: a new session may make it
            try:
                array: np.ndarray[Any, Any] = claim.result()
            except RemoteError as exc:
                message = f"{source} refused the claim: {exc.error.message}"
                raise StoreError(exc.code, message) from None
            except ConnectionLost as exc:
                self._forget(source, conn)
                raise _failed(f"the pull from {source} was cut off: {exc}") from None
            return array
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _session(self, source: str) -> Connection:
        """The kept session with ``source``, opened if there is none (outside the lock: a
        slow source delays only its own pulls)."""
        with self._lock:
            conn = self._sessions.get(source)
        if conn is not None:
            return conn
        from client._connection import Connection
        from client._liveness import Liveness
        from client.errors import ConnectionLost, HandshakeError

        liveness = Liveness(PING_INTERVAL, PING_TIMEOUT, None)
        try:
            conn = Connection(
                source, 0, self._token, OPEN_TIMEOUT, self._ca_file, liveness, pool_bytes=0
            )
        except HandshakeError as exc:
            raise _failed(
                f"{source} refused this server's session: {exc} (a server presents its "
                "--peer-token, by default its --token)"
            ) from None
        except (ConnectionLost, OSError, ValueError) as exc:
            raise _failed(f"cannot reach {source}: {exc}") from None
        with self._lock:
            kept = self._sessions.setdefault(source, conn)
        if kept is not conn:
            conn.close()  # another pull opened one meanwhile
        return kept

    def _forget(self, source: str, conn: Connection) -> None:
        with self._lock:
            if self._sessions.get(source) is conn:
                del self._sessions[source]
        conn.close()

    def close(self) -> None:
        """Close every kept session (the server is stopping)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for conn in sessions:
            conn.close()


def url_parts(url: str) -> tuple[str, str, str] | None:
    """``(scheme, host, port)`` of a peer URL or pattern (host lower-cased, the port the
    scheme's default when absent), or None for anything else (a user name, a path, a query)."""
    match = URL_PARTS.match(url)
    if match is None:
        return None
    scheme, host, port = match.groups()
    return scheme, host.lower(), port or DEFAULT_PORTS[scheme]


def _matches(source: tuple[str, str, str], pattern: tuple[str, str, str] | None) -> bool:
    if pattern is None or source[0] != pattern[0]:
        return False
    labels, wanted = source[1].split("."), pattern[1].split(".")
    return (
        len(labels) == len(wanted)
        and all(fnmatch.fnmatchcase(a, b) for a, b in zip(labels, wanted, strict=True))
        and fnmatch.fnmatchcase(source[2], pattern[2])
    )


def _failed(message: str) -> StoreError:
    return StoreError(ErrorCode.TRANSFER_FAILED, message)
