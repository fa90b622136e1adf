"""The base of every protocol message: a frozen, strict pydantic model that says how many raw
buffers follow its JSON header (``protocol.codec``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Message(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, ser_json_inf_nan="constants"
    )

    def buffer_sizes(self) -> tuple[int, ...]:
        """Byte lengths of the raw buffers that follow the header, in order."""
        return ()
