"""``pull``: a tensor copied from another session's exposure, on another server or this one.

The client asks the source session for a capability (``protocol.messages.Expose``), then sends
this op to the target session, which fetches the bytes itself (``protocol.messages.Claim``):
they never pass through the client. The client knows the tensor's shape and dtype, so the op
carries them and its output is inferred like any op's (ARCHITECTURE.md, invariant 3).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..dtypes import DType
from .base import BaseOp, Dim, TensorMeta, check_shape

# What a capability looks like: 43 characters of secrets.token_urlsafe(32)
Capability = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{43}$")]
SourceURL = Annotated[str, Field(pattern=r"^wss?://[^\s/]+(/\S*)?$", max_length=2048)]


class Pull(BaseOp):
    """Copy the tensor behind ``capability`` into ``out``. ``source`` is the URL of the server
    that issued it, or None for this server (a copy in memory, no network)."""

    kind: Literal["pull"] = "pull"
    source: SourceURL | None
    capability: Capability
    shape: tuple[Dim, ...]
    dtype: DType

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta(check_shape(self.shape), self.dtype)

    def describe(self) -> str:
        where = "this server" if self.source is None else self.source
        return f"pull[{where}]() -> #{self.out}"
