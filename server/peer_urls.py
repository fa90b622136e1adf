"""Which URLs name a peer server: ``--peers`` patterns, matched part by part.

A peer URL is ``scheme://host[:port]``: no user name (``ws://peer@evil``), no path, no query.
A pattern's host labels and port may be shell-style wildcards, matched label by label, so a
``*`` never spans a dot; a source URL may hold none. A host with a numeric label that is not a
dotted-quad IPv4 address (``3232235777``, ``0x7f.1``: resolvers read them as addresses) never
matches, nor does an IPv6 address (brackets are not in the grammar), nor a host with an empty
label (``peer.``, ``a..b``). Sessions with peers are kept by a URL's canonical form
(:func:`canonical`: the scheme, the host in lower case, the port as a number from 1 to 65535,
the scheme's default if none is given), and patterns match that form, so every spelling of one
server (``:08765``, ``:8765/``, ``PEER``) names one peer and shares one session.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re

LABEL = r"[A-Za-z0-9_*?-]+"  # no empty label: "peer." and "a..b" are no peer URLs
URL_PARTS = re.compile(rf"^(wss?)://({LABEL}(?:\.{LABEL})*)(?::([0-9]+|\*))?/?$")
DEFAULT_PORTS = {"ws": "80", "wss": "443"}
Parts = tuple[str, str, str]  # scheme, host (lower case), port


def url_parts(url: str) -> Parts | None:
    """``(scheme, host, port)`` of a peer URL or pattern, canonical: host lower-cased, a port
    of digits as its number (the scheme's default when absent), a wildcard port as written;
    None for anything else (a port outside 1..65535, an empty host label)."""
    match = URL_PARTS.match(url)
    if match is None:
        return None
    scheme, host, port = match.groups()
    port = port or DEFAULT_PORTS[scheme]
    if port.isdigit():
        if not 1 <= int(port) <= 65535:
            return None
        port = str(int(port))  # 08765 is 8765
    return scheme, host.lower(), port


def canonical(parts: Parts) -> str:
    return f"{parts[0]}://{parts[1]}:{parts[2]}"


class PeerPatterns:
    """The ``--peers`` patterns of a server."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.patterns = patterns
        self._parsed = [p for p in map(url_parts, patterns) if p is not None]

    def match(self, source: str) -> Parts | None:
        """``source``'s parts if it names a peer: its scheme the same as a pattern's, each
        label of its host matched by that pattern's label, its port too; else None."""
        parts = url_parts(source)
        if parts is None or any(c in "*?[" for c in parts[1] + parts[2]):
            return None
        if _numeric_trick(parts[1]):
            return None
        return parts if any(_matches(parts, p) for p in self._parsed) else None


def _numeric_trick(host: str) -> bool:
    """A host that a resolver may read as an address other than it looks: a numeric or hex
    label in anything but a dotted-quad IPv4 address."""
    labels = host.split(".")
    quad = len(labels) == 4 and all(
        label.isdigit() and str(int(label)) == label and int(label) < 256 for label in labels
    )
    return not quad and any(label.isdigit() or label.startswith("0x") for label in labels)


def _matches(source: Parts, pattern: Parts) -> bool:
    if source[0] != pattern[0]:
        return False
    labels, wanted = source[1].split("."), pattern[1].split(".")
    return (
        len(labels) == len(wanted)
        and all(fnmatch.fnmatchcase(a, b) for a, b in zip(labels, wanted, strict=True))
        and fnmatch.fnmatchcase(source[2], pattern[2])
    )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; False for anything else (names too)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposed(patterns: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Of ``patterns``, those over which a peer token would travel in clear (``ws://`` to a
    host other than loopback), and those that match any port."""
    parsed = [(p, parts) for p in patterns if (parts := url_parts(p)) is not None]
    clear = [p for p, (scheme, host, _) in parsed if scheme == "ws" and not is_loopback(host)]
    return clear, [p for p, (_, _, port) in parsed if port == "*"]
