"""The installed version of Tensorwire, read from the package metadata (``pyproject.toml``'s
``[project] version``, recorded by ``pip install``), so that it is written in one place.

``protocol``, ``client`` and ``server`` each export it as ``__version__``; every command's
``--version`` prints :func:`version_text`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .messages import PROTOCOL_VERSION

DISTRIBUTION = "tensorwire"  # [project] name in pyproject.toml
UNKNOWN_VERSION = "0+unknown"  # the packages run from a checkout that pip never installed


def distribution_version() -> str:
    """The installed distribution's version, or :data:`UNKNOWN_VERSION` when it is not
    installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN_VERSION


def version_text() -> str:
    """What ``--version`` prints: the distribution's version and the protocol it speaks."""
    return f"{DISTRIBUTION} {distribution_version()} (protocol {PROTOCOL_VERSION})"
