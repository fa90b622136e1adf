"""Server configuration, read from flags and ``TENSORWIRE_*`` or ``TENSOR_SERVER_*`` variables.

Nothing here binds, spawns or starts a loop (an import contract in ``pyproject.toml`` keeps
sockets, processes and event loops out). Reading ``--token-file`` and the cgroup memory limit
are the only file reads; the TLS files are read by ``server.guard`` when the server is built.

Every field of :class:`ServerConfig` is one setting: ``python -m server`` makes a flag of it
(``max_message_size`` -> ``--max-message-size``) and pydantic-settings reads the same setting
from the environment (``TENSORWIRE_MAX_MESSAGE_SIZE``, or the older
``TENSOR_SERVER_MAX_MESSAGE_SIZE``; the first wins where both are set); a flag beats the
variables, the variables beat the default. Adding a setting is adding a field with a
``description``.

The checks a configuration passes before anything binds (the device, the exposure) live in
``server.startup_checks``; this module exports them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from protocol import DeviceSpec, NdArraySpec
from protocol.codec import MAX_BUFFERS

from .peer_urls import URL_PARTS
from .setting_values import AUTO_BUDGET_FRACTION as AUTO_BUDGET_FRACTION
from .setting_values import ENV_PREFIX as ENV_PREFIX
from .setting_values import (
    Size,
    environment_sources,
    parse_budget,
    parse_device,
    parse_list,
    parse_size,
    parse_token,
    physical_memory,
    read_token_file,
)
from .setting_values import cgroup_memory_limit as cgroup_memory_limit
from .startup_checks import InsecureConfigError as InsecureConfigError
from .startup_checks import UnsupportedDeviceError as UnsupportedDeviceError
from .startup_checks import validate_host_device as validate_host_device
from .startup_checks import validate_security as validate_security

# Element operations one op may cost (``executor.cost``, about a nanosecond each): the default
# of ``--max-op-cost``. It passes a 4096x4096 float32 matmul 8 times over, a 6000x6000 float64
# one and a reduction over 2**34 elements, and refuses a 3e10-multiply-add int64 matmul
# (bench/REASONS.md, 'Default --max-op-cost').
MAX_OP_COST = 2**35


# A peer's URL, or a pattern of them, in peer_urls' grammar (which matches them part by part).
PeerURL = Annotated[str, Field(pattern=URL_PARTS.pattern)]


class ServerConfig(BaseSettings):
    """Everything ``python -m server`` takes. Validated as a whole before anything binds.

    Constructing one reads ``TENSORWIRE_*`` and ``TENSOR_SERVER_*`` variables for the fields not
    given (``TENSORWIRE_*`` first).

    Raises:
        pydantic.ValidationError: a value is out of range, malformed, or ``token_file`` cannot
            be read.
    """

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,  # TENSOR_SERVER_TOKEN= (empty) means unset, not an empty token
        validate_default=True,
    )
    device: Annotated[DeviceSpec, NoDecode, BeforeValidator(parse_device)] = Field(
        default=NdArraySpec(),
        description="device to host: ndarray or ndarray:N (N devices, indices 0..N-1); "
        "remote:URL and capture:SPEC are refused",
    )
    host: str = Field(default="127.0.0.1", description="address to bind")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(
        default=8765, description="port to bind; 0 picks a free one"
    )
    token: Annotated[str | None, BeforeValidator(parse_token)] = Field(
        default=None,
        description="token clients must present; surrounding whitespace is ignored, and an "
        "empty one is refused",
    )
    token_file: Path | None = Field(
        default=None,
        description="read the token from this file (a docker/compose secret); "
        "surrounding whitespace is ignored",
    )
    max_message_size: Annotated[Size, Field(ge=1024)] = Field(
        default=2**31, description="largest websocket message accepted, in bytes"
    )
    worker_threads: Annotated[int, Field(ge=1)] = Field(
        default=max(1, os.cpu_count() or 1), description="threads running heavy ops"
    )
    handshake_timeout: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="seconds a new connection has to send its hello"
    )
    shutdown_grace: Annotated[float, Field(ge=0)] = Field(
        default=5.0,
        description="seconds in-flight work may take to finish after SIGTERM before every "
        "session is closed",
    )
    memory_budget: Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(parse_budget)] = (
        Field(
            default=None,
            description="server-wide budget for tensor bytes (e.g. 3GiB); 'auto' = 75% of the "
            "container's cgroup memory limit; unset = half the machine's memory; new work beyond "
            "it fails with server_memory_exhausted",
        )
    )
    spare_memory: Size = Field(
        default=2**30,
        description="memory of freed uploads of 1 MiB and up kept for uploads of the same size, "
        "in bytes (each for --spare-ttl at most; counted in the memory budget, dropped before "
        "work is refused; 0 = off)",
    )
    spare_ttl: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=10.0,
        description="seconds a spare upload array is kept unused, and that no op may run before "
        "the server gives malloc's freed memory back to the system",
    )
    # --- security and limits (docs/security.md; each is a row of docs/limits.md) --------------
    insecure: bool = Field(
        default=False, description="allow a non-loopback bind without a token (warns loudly)"
    )
    tls_cert: Path | None = Field(default=None, description="PEM certificate chain: serve wss://")
    tls_key: Path | None = Field(default=None, description="PEM private key of --tls-cert")
    allowed_origins: Annotated[tuple[str, ...], NoDecode, BeforeValidator(parse_list)] = Field(
        default=(),
        description="browser Origin values allowed, comma-separated; a connection with any "
        "other Origin header is refused",
    )
    max_connections: Annotated[int, Field(ge=1)] = Field(
        default=256, description="open websocket connections; more are refused with 503"
    )
    idle_timeout: Annotated[float, Field(gt=0)] = Field(
        default=600.0,
        description="seconds a session may send nothing while the server owes it nothing",
    )
    ping_interval: Annotated[float, Field(gt=0)] = Field(
        default=20.0, description="seconds between keepalive pings"
    )
    ping_timeout: Annotated[float, Field(gt=0)] = Field(
        default=20.0, description="seconds a ping's pong may take before the connection drops"
    )
    resume_window: Annotated[float, Field(ge=0, le=86400)] = Field(
        default=60.0,
        description="seconds a session whose connection was lost waits, its tensors kept, for "
        "its client to reconnect and resume it; 0: sessions end with their connection",
    )
    max_detached: Annotated[int, Field(ge=0)] = Field(
        default=64,
        description="sessions waiting to be resumed, in all; past it the oldest is ended",
    )
    max_detached_per_token: Annotated[int, Field(ge=0)] = Field(
        default=16,
        description="sessions waiting to be resumed per bearer token presented (or none); "
        "past it that token's oldest is ended",
    )
    send_timeout: Annotated[float, Field(gt=0)] = Field(
        default=300.0, description="seconds a client may take to receive one reply"
    )
    write_limit: Annotated[Size, Field(ge=1024)] = Field(
        default=2**20, description="outgoing bytes buffered per connection before sends wait"
    )
    max_queued: Annotated[int, Field(ge=1)] = Field(
        default=8, description="received messages queued per session before reading stops"
    )
    max_header_size: Annotated[Size, Field(ge=1024, le=64 * 2**20)] = Field(
        default=4 * 2**20,
        description="largest message header (JSON), in bytes; a parsed header takes about 14x "
        "its size in objects, uncounted, while its batch waits and runs",
    )
    max_buffers: Annotated[int, Field(ge=1, le=MAX_BUFFERS)] = Field(
        default=MAX_BUFFERS, description="raw buffers (uploads) one message may carry"
    )
    max_op_bytes: Size = Field(
        default=2 * 2**30, description="largest output of one op, in bytes, checked before numpy"
    )
    max_op_cost: Annotated[int, Field(ge=1)] = Field(
        default=MAX_OP_COST,
        description="most work one op may cost, in element operations (about a nanosecond of "
        "numpy each), estimated and checked before numpy runs: sorts, FFTs, matmuls and "
        "linalg count their real work, not only their output's size",
    )
    max_ndim: Annotated[int, Field(ge=0, le=64)] = Field(
        default=64, description="most dimensions of any tensor"
    )
    max_graphs: Annotated[int, Field(ge=0)] = Field(
        default=64, description="graphs one session may hold registered (run_graph)"
    )
    max_graph_bytes: Size = Field(
        default=256 * 2**20,
        description="bytes one session's registered graphs may hold (their constants, and 1 KiB "
        "an op), counted in its quota too",
    )
    session_quota: Annotated[Size | None, BeforeValidator(parse_size)] = Field(
        default=None,
        description="tensor bytes one session may hold (e.g. 1GiB); unset = half of the "
        "memory budget",
    )
    op_deadline: Annotated[float, Field(gt=0)] = Field(
        default=600.0,
        description="seconds one op may run; past it the session is closed (numpy is not "
        "interrupted: its result is discarded when it returns, which --max-op-cost bounds)",
    )
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = Field(
        default=None,
        description="serve GET /metrics on this port (same host) instead of the main port",
    )
    metrics_auth: Literal["token", "none"] = Field(
        default="token",
        description="token: GET /metrics needs 'Authorization: Bearer TOKEN' when a token is "
        "set; none: open",
    )
    # --- direct transfers between servers (server/peers.py, server/exposures.py) -----------------
    peers: Annotated[tuple[PeerURL, ...], NoDecode, BeforeValidator(parse_list)] = Field(
        default=(),
        description="servers this one may pull tensors from, comma-separated ws:// or wss:// URLs "
        "of the form scheme://host:port; a host label or the port may be a shell-style wildcard "
        "(ws://tensorwire-*.tensorwire:8765; a * never spans a dot); a pull from any other "
        "source is refused, so a client cannot make this server connect elsewhere",
    )
    peer_token: Annotated[str | None, BeforeValidator(parse_token)] = Field(
        default=None, description="token this server presents to its peers; unset = its own token"
    )
    peer_token_file: Path | None = Field(
        default=None, description="read the peer token from this file (a secret)"
    )
    allow_any_peer_port: bool = Field(
        default=False,
        description="let a --peers pattern match any port (ws://127.0.0.1:*), which a server with "
        "a peer token refuses otherwise: any listener on those hosts could be sent the token",
    )
    peer_ca_file: Path | None = Field(
        default=None,
        description="PEM CA certificates that wss:// peers' certificates must chain to "
        "(default: the system's)",
    )
    transfer_ttl: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=300.0,
        description="seconds a transfer capability (an expose) lives before it is refused",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="WARNING", description="least severe log event written (INFO: every session)"
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="one event per line on stderr: key=value text or JSON"
    )
    log_rate: Annotated[float, Field(ge=0)] = Field(
        default=100.0, description="log lines a second at most, a tenth per connection; 0: none"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (given as arguments), then ``TENSORWIRE_*``, then ``TENSOR_SERVER_*``."""
        return (init_settings, *environment_sources(settings_cls))

    @model_validator(mode="before")
    @classmethod
    def _prepare(cls, data: Any) -> Any:
        """Upper-case ``log_level``; read ``token_file`` and ``peer_token_file``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("log_level"), str):
            data["log_level"] = data["log_level"].upper()
        if data.get("token_file") not in (None, ""):
            if data.get("token") is not None:
                raise ValueError(
                    f"give --token ({ENV_PREFIX}TOKEN) or --token-file ({ENV_PREFIX}TOKEN_FILE), "
                    "not both"
                )
            data["token"] = read_token_file(Path(data["token_file"]))
        if data.get("peer_token_file") not in (None, ""):
            if data.get("peer_token") is not None:
                raise ValueError(
                    f"give --peer-token ({ENV_PREFIX}PEER_TOKEN) or --peer-token-file "
                    f"({ENV_PREFIX}PEER_TOKEN_FILE), not both"
                )
            data["peer_token"] = read_token_file(Path(data["peer_token_file"]), "peer-token-file")
        return data

    @property
    def credentials(self) -> str | None:
        """The token this server presents to its peers."""
        return self.token if self.peer_token is None else self.peer_token

    @property
    def effective_memory_budget(self) -> int:
        return physical_memory() // 2 if self.memory_budget is None else self.memory_budget

    @property
    def effective_session_quota(self) -> int:
        if self.session_quota is None:
            return self.effective_memory_budget // 2
        return self.session_quota

    @model_validator(mode="after")
    def _ports_differ(self) -> ServerConfig:
        if self.metrics_port is not None and self.metrics_port == self.port != 0:
            raise ValueError(
                f"--metrics-port ({ENV_PREFIX}METRICS_PORT) must differ from --port "
                f"({ENV_PREFIX}PORT); leave it unset to serve /metrics on the main port"
            )
        return self
