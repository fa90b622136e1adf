"""Where a device finds its server and token when the code does not say: the environment.

``TENSORWIRE_URL`` is the server's URL; the token is ``TENSORWIRE_TOKEN``, or the contents of
the file ``TENSORWIRE_TOKEN_FILE`` (a mounted secret; surrounding whitespace is ignored), or
else the older ``TENSOR_SERVER_TOKEN``, which the server reads too. A value given in code
always wins; an empty variable counts as unset.
"""

from __future__ import annotations

import os
from pathlib import Path

URL_ENV = "TENSORWIRE_URL"
TOKEN_ENV = "TENSORWIRE_TOKEN"  # noqa: S105 - the variable's name, not a token
TOKEN_FILE_ENV = "TENSORWIRE_TOKEN_FILE"  # noqa: S105 - likewise
LEGACY_TOKEN_ENV = "TENSOR_SERVER_TOKEN"  # noqa: S105 - the server's older name, still read


def _variable(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def server_url(url: str | None) -> str:
    """``url``, else ``TENSORWIRE_URL``.

    Raises:
        ValueError: neither is given.
    """
    found = url or _variable(URL_ENV)
    if found is None:
        raise ValueError(f"no server URL: give one (ws://HOST:PORT) or set {URL_ENV}")
    return found


def server_token(token: str | None) -> str | None:
    """``token``, else ``TENSORWIRE_TOKEN``, else ``TENSORWIRE_TOKEN_FILE``'s contents, else
    ``TENSOR_SERVER_TOKEN``; None when none is set (no token is sent).

    Raises:
        ValueError: both ``TENSORWIRE_TOKEN`` and ``TENSORWIRE_TOKEN_FILE`` are set, or the file
            cannot be read or is empty.
    """
    if token is not None:
        return token
    named, path = _variable(TOKEN_ENV), _variable(TOKEN_FILE_ENV)
    if named is not None and path is not None:
        raise ValueError(f"set {TOKEN_ENV} or {TOKEN_FILE_ENV}, not both")
    if path is not None:
        try:
            named = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{TOKEN_FILE_ENV}: cannot read {path}: {exc}") from None
        if not named:
            raise ValueError(f"{TOKEN_FILE_ENV}: {path} is empty")
    return named or _variable(LEGACY_TOKEN_ENV)
