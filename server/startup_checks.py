"""The checks a configuration passes before anything binds: the device a server may host, and
the exposure it may accept (a token off loopback, TLS files in pairs, where the peer token may
travel). ``server.config`` exports them beside the settings they check.

The device check is the seed of this project (from Burn's remote backend): a server must never
host a *remote* device (it would forward ops to another server, forever) nor a *capture* device
(it records ops instead of executing them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol import CaptureSpec, NdArraySpec, RemoteSpec

from .peer_urls import exposed, is_loopback
from .setting_values import ENV_PREFIX

if TYPE_CHECKING:  # the settings are handed in; this module makes none
    from .config import ServerConfig


class UnsupportedDeviceError(ValueError):
    """The server was asked to host a device it must never host (remote or capture)."""


class InsecureConfigError(ValueError):
    """A configuration that would expose the server unsafely (see :func:`validate_security`)."""


def validate_host_device(device: NdArraySpec | RemoteSpec | CaptureSpec) -> NdArraySpec:
    """Return the local device a server may host, or refuse with the reason and the fix.

    Raises:
        UnsupportedDeviceError: ``device`` is a remote or a capture device. The message is one
            line, fit for stderr.
    """
    if isinstance(device, RemoteSpec):
        raise UnsupportedDeviceError(
            f"cannot host a remote server on a remote device ({device}): a server must execute "
            "ops itself; point it at a local backend such as --device ndarray, and never reuse "
            "a client's remote device config for the server"
        )
    if isinstance(device, CaptureSpec):
        inner = device.inner
        while isinstance(inner, CaptureSpec):
            inner = inner.inner
        serve = "ndarray" if inner is None else str(inner)
        raise UnsupportedDeviceError(
            f"cannot host a remote server on a capture device ({device}): a capture device "
            f"records ops instead of executing them and belongs on the client "
            f"(client.open_device); serve the inner device instead: --device {serve}"
        )
    return device


def validate_security(config: ServerConfig) -> list[str]:
    """Refuse an exposed server without a token (like Redis's protected mode); return the
    warnings to print, one line each.

    Raises:
        InsecureConfigError: a non-loopback bind without a token or ``insecure``, only one of
            ``tls_cert``/``tls_key``, or a peer token sent to any port of a ``--peers`` host
            without ``allow_any_peer_port``. The message is one line, fit for stderr.
    """
    if (config.tls_cert is None) != (config.tls_key is None):
        raise InsecureConfigError(
            f"--tls-cert ({ENV_PREFIX}TLS_CERT) and --tls-key ({ENV_PREFIX}TLS_KEY) go together"
        )
    warnings = _peer_warnings(config)
    if is_loopback(config.host):
        return warnings
    if config.token is None and not config.insecure:
        raise InsecureConfigError(
            f"refusing to bind {config.host} without a token: anyone who can reach it could run "
            f"ops and read every tensor; set --token or {ENV_PREFIX}TOKEN (or --token-file), "
            "bind 127.0.0.1, or pass --insecure to accept the risk"
        )
    if config.token is None:
        warnings.append(
            f"--insecure: serving {config.host} with no token; anyone who can reach "
            "this port can run ops and read every tensor"
        )
    elif config.tls_cert is None:
        warnings.append(
            f"serving {config.host} without TLS: the token and tensors travel in clear; "
            "use --tls-cert/--tls-key"
        )
    return warnings


def _peer_warnings(config: ServerConfig) -> list[str]:
    """What the peer settings expose: the peer token sent in clear, or to any port.

    Raises:
        InsecureConfigError: to any port, without ``allow_any_peer_port``.
    """
    if config.credentials is None:
        return []
    clear, any_port = exposed(config.peers)
    if any_port and not config.allow_any_peer_port:
        raise InsecureConfigError(
            f"--peers {', '.join(any_port)}: any port matches, so a client could have this server "
            "present its peer token to any listener on those hosts; name the port, or pass "
            f"--allow-any-peer-port ({ENV_PREFIX}ALLOW_ANY_PEER_PORT) to accept the risk"
        )
    return [
        f"--peers {', '.join(peers)}: {why}"
        for peers, why in (
            (clear, "this server's peer token travels to them in clear; use wss:// peers"),
            (any_port, "any port matches, so any listener on those hosts may get the peer token"),
        )
        if peers
    ]
