"""How one server setting's text (a flag or a ``TENSORWIRE_*`` or ``TENSOR_SERVER_*``
variable) becomes its value: sizes, the memory budget (``auto`` reads the cgroup limit), tokens
and token files, lists, device specs; and the two variable prefixes. ``server.config`` declares
the settings with these. Reading a token file and the cgroup memory limit are the only file
reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, ByteSize, Field, TypeAdapter
from pydantic_settings import BaseSettings, EnvSettingsSource

from protocol import parse_device_spec

ENV_PREFIX = "TENSOR_SERVER_"  # the settings' variables, as the messages name them
# The same settings under the client's prefix (TENSORWIRE_URL, TENSORWIRE_TOKEN): TENSORWIRE_PORT
# is TENSOR_SERVER_PORT; where both are set, TENSORWIRE_* wins.
NEW_ENV_PREFIX = "TENSORWIRE_"
CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")  # cgroup v2: the container's memory limit
AUTO_BUDGET_FRACTION = 0.75  # of the container's limit; the rest is Python, buffers, replies


def parse_device(value: object) -> object:
    """A device spec string (flag or variable) becomes a typed spec; models pass through.
    Raises ``DeviceSpecError`` (a ``ValueError``) for a string that names no device."""
    return parse_device_spec(value) if isinstance(value, str) else value


def cgroup_memory_limit(path: Path = CGROUP_MEMORY_MAX) -> int | None:
    """The memory limit of the cgroup this process runs in, or None when there is none."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" means unlimited


_BYTES: TypeAdapter[ByteSize] = TypeAdapter(ByteSize)


def physical_memory() -> int:
    """This machine's memory in bytes (8 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux or macOS
        return 8 * 2**30


def parse_size(value: object) -> object:
    """``64MiB``, ``2GiB``, ``1048576`` -> int bytes; ``none`` or empty -> None."""
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        return None
    return value if value is None or isinstance(value, int) else int(_BYTES.validate_python(value))


def parse_list(value: object) -> object:
    """A comma-separated string (flag or variable) becomes a tuple of origins."""
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return value


Size = Annotated[Annotated[int, Field(ge=0)], BeforeValidator(parse_size)]


def parse_token(value: object) -> object:
    """A token without its surrounding whitespace, as a token file's and as the server reads a
    presented one (so ``--token " t "`` is reachable); refused when nothing is left, since an
    empty ``Authorization: Bearer`` would then open a session. ``None`` passes (no token)."""
    if not isinstance(value, str):
        return value
    token = value.strip()
    if not token:
        raise ValueError("the token is empty or only whitespace: give a token, or none at all")
    return token


def parse_budget(value: object) -> object:
    """``auto`` -> a fraction of the cgroup memory limit (None without one); ``3GiB`` -> int."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        limit = cgroup_memory_limit()
        return None if limit is None else int(limit * AUTO_BUDGET_FRACTION)
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        return None
    return value if value is None or isinstance(value, int) else int(_BYTES.validate_python(value))


def read_token_file(path: Path, flag: str = "token-file") -> str:
    """The token in ``path``, without surrounding whitespace.

    Raises:
        ValueError: the file cannot be read or holds only whitespace (one line, for stderr).
    """
    where = f"--{flag} ({ENV_PREFIX}{flag.upper().replace('-', '_')})"
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"{where}: cannot read {path}: {reason}") from None
    if not token:
        raise ValueError(f"{where}: {path} is empty")
    return token


def environment_sources(settings: type[BaseSettings]) -> tuple[EnvSettingsSource, ...]:
    """The settings' variables, first source first: ``TENSORWIRE_*``, then ``TENSOR_SERVER_*``
    (an empty variable counts as unset)."""
    return tuple(
        EnvSettingsSource(settings, env_prefix=prefix, env_ignore_empty=True)
        for prefix in (NEW_ENV_PREFIX, ENV_PREFIX)
    )
