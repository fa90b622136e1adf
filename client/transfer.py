"""Moving an array to another device (``x.to_device(dev)``), the bytes taking the shortest way.

- Two devices of one server (the same ``server_id``): the target session pulls from this
  server, a copy in its memory; nothing crosses a network.
- Two servers: the client asks the source for a capability bound to the target server
  (:meth:`Device.expose`, one round trip, answered once the array's ops have run) and hands it
  to the target in a :class:`~protocol.ops.Pull` op, queued like any op (``to_device``
  returns after the capability's round trip); the target fetches the bytes from the source
  itself (it must list the source in its ``--peers``). They never pass through the client.
  A failed pull (no credentials for the source, source refused or lost, capability refused)
  fails the new array like a failed op: reading it raises :class:`~client.TransferError`
  naming the source.
- Anything else (the in-process ``ndarray`` device, a capture device): read, then upload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol.ops import Pull

from ._building import apply, upload
from .device import AsyncRemoteDevice, Device, RemoteDevice

if TYPE_CHECKING:
    from .array import RemoteArray

SERVED = (RemoteDevice, AsyncRemoteDevice)  # devices of a server, which can pull


def to_device(x: RemoteArray, target: Device) -> RemoteArray:
    """``x`` copied to ``target`` (not ``x``'s device).

    Raises:
        RemoteError: the op that made ``x`` failed, or the source refused to expose it.
        ConnectionLost: a connection closed or broke.
    """
    source = x.device
    if not (isinstance(source, SERVED) and isinstance(target, SERVED)):
        return upload(x.numpy(), target)
    reply = source.expose(x.tensor_id, target.server_id).result()
    here = source.server_id == target.server_id
    pulled = apply(
        lambda out: Pull(
            out=out,
            source=None if here else source.url,
            capability=reply.capability,
            shape=x.meta.shape,
            dtype=x.meta.dtype,
        ),
        device=target,
    )
    target.flush()  # the source holds the bytes twice until the target pulls: now
    return pulled
