"""Through a real server, whose sessions take the fast path for every op of the training
examples (``server/fastpath.py``, ``server/fastkeys.py``): what a client sees — losses and
parameters of training steps, views read after in-place updates, each refused or failed op's
error at its read (code, op and message), the session's counts — is what the general path
gives, run by the same server code on an in-process ``ndarray`` device with the fast path off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff
from client.errors import RemoteError
from client.local import LocalDevice
from server import fastpath as fastpath_module
from server import session as session_module

from .servers import ServerProcess, run_server

QUOTA, OP_BYTES = 3 << 20, 1 << 20


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerProcess]:
    with run_server("--session-quota", str(QUOTA), "--max-op-bytes", str(OP_BYTES)) as proc:
        yield proc


def _read(array: Any) -> Any:
    """What a client learns by reading ``array``: its value, or its error."""
    try:
        value = np.asarray(array)
    except RemoteError as exc:
        return (exc.code, exc.op, str(exc))
    return (value.dtype.str, value.shape, value.tobytes())


def _training(ad: Autodiff) -> list[Any]:
    """Three Adam steps of a small MLP with cross-entropy, as the examples train: the losses
    and the parameters after."""
    rng = np.random.default_rng(0)
    model = nn.Sequential(
        nn.Linear(8, 16, ad=ad, rng=rng), nn.ReLU(), nn.Linear(16, 4, ad=ad, rng=rng)
    )
    x = ad.asarray(rng.standard_normal((32, 8), dtype=np.float32))
    y = ad.asarray(rng.integers(0, 4, 32))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    seen = []
    for step in range(3):
        index = ad.asarray(np.arange(step, step + 16))
        loss = nn.cross_entropy(model(ad.take(x, index, axis=0)), ad.take(y, index, axis=0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append(_read(loss.array))
    return seen + [_read(p.array) for p in model.parameters()]


def _edges(xp: Any, kept: list[Any]) -> list[Any]:
    """Views read after in-place updates, and refused and failed ops read (each tensor kept in
    ``kept``, so that the session's counts do not depend on when a client drops a handle)."""
    a = xp.reshape(xp.arange(24, dtype=xp.float32), (4, 6))
    view, column = xp.permute_dims(a, (1, 0)), a[:, 2]
    a += 1.0
    a[0:2] = xp.full((6,), 7.0, dtype=xp.float32)
    a *= xp.ones((4, 6), dtype=xp.float32)
    seen = [_read(view), _read(column), _read(xp.sum(a, axis=1)), _read(xp.mean(a))]
    wide = xp.broadcast_to(a[0], (OP_BYTES // 16, 6))  # a view over the per-op byte cap
    outside = xp.take(a, xp.asarray(np.array([100])), axis=0)  # numpy's IndexError
    inherits = xp.where(outside > 0, outside, 0.0)
    seen += [_read(wide), _read(outside), _read(inherits)]
    held = [xp.zeros((OP_BYTES // 4,), dtype=xp.float32) for _ in range(4)]  # the 4th: quota
    sums = [xp.sum(h) for h in held]
    seen += [_read(s) for s in sums]
    flat = xp.reshape(a, (24,))  # a view reserves its bytes first: quota too
    seen.append(_read(flat))
    kept += [a, view, column, wide, outside, inherits, held, sums, flat]
    return seen


def _observe(dev: client.RemoteDevice | LocalDevice) -> list[Any]:
    xp = client.namespace(dev)
    kept: list[Any] = []
    seen = _training(Autodiff(xp)) + _edges(xp, kept)
    stats = dev.stats()
    return seen + [(stats.tensors, stats.tensor_bytes, stats.failed)]


def test_a_client_sees_what_the_general_path_gives(
    limited: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client.RemoteDevice(limited.url) as dev:
        remote = _observe(dev)
    with LocalDevice(session_quota=QUOTA, max_op_bytes=OP_BYTES) as local:
        fast_here = _observe(local)
    monkeypatch.setattr(session_module, "FAST_OPS", frozenset())
    monkeypatch.setattr(fastpath_module, "KEYS", {})
    with LocalDevice(session_quota=QUOTA, max_op_bytes=OP_BYTES) as local:
        general = _observe(local)
    assert remote == general == fast_here
    column = np.frombuffer(remote[8][2], np.float32)
    assert np.array_equal(column, [7.0, 7.0, 15.0, 21.0])  # the view saw both writes
    errors = [s[0] for s in remote if isinstance(s[0], str) and s[0] not in ("<f4", "<i8")]
    assert errors == [
        "limit_exceeded",
        "execution_failed",
        "execution_failed",  # where() inherits the take's failure
        "quota_exceeded",
        "quota_exceeded",
    ], remote
