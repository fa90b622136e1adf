"""``python -m server.healthcheck``: exit 0 when the server in this container is serving.

The Dockerfile's ``HEALTHCHECK`` and compose's ``healthcheck`` run it. It asks
``GET http://127.0.0.1:PORT/healthz`` (PORT from ``TENSORWIRE_PORT`` or
``TENSOR_SERVER_PORT``, as the server reads them, or ``--url``) and exits 0 on 200, 1 on anything
else (503 while draining, no answer, an error), printing one line either way. Standard library
only, like a ``curl -f`` the slim image does not have.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, version

DEFAULT_PORT = 8765  # ServerConfig's default; not imported, to keep this check light


def health_url() -> str:
    """``/healthz`` of the server this container runs, on loopback."""
    port = (
        os.environ.get("TENSORWIRE_PORT", "").strip()  # wins over the older name, as for the server
        or os.environ.get("TENSOR_SERVER_PORT", "").strip()
        or str(DEFAULT_PORT)
    )
    return f"http://127.0.0.1:{port}/healthz"


def installed_version() -> str:
    """Tensorwire's version from the package metadata (``protocol.version``'s reading, which
    this light module may not import), or ``0+unknown`` outside an installation."""
    try:
        return version("tensorwire")
    except PackageNotFoundError:
        return "0+unknown"


def check(url: str, timeout: float) -> tuple[bool, str]:
    """``(healthy, what the server said)``; never raises for a network failure."""
    try:
        # the URL is ours: http on loopback (or the --url the operator gave)
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
            return response.status == 200, response.read(512).decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}: {exc.read(512).decode(errors='replace').strip()}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"no answer from {url}: {getattr(exc, 'reason', exc)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m server.healthcheck", description=__doc__)
    p.add_argument(
        "--url", default=None, help="default: http://127.0.0.1:$TENSOR_SERVER_PORT/healthz"
    )
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait (default: 3)")
    p.add_argument("--version", action="version", version=f"tensorwire {installed_version()}")
    args = p.parse_args(argv)
    healthy, said = check(args.url or health_url(), args.timeout)
    print(said, flush=True)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
