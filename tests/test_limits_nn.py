"""Convolution bombs through a real server with small limits (``tests/test_limits.py``'s
server and fixtures): a small input whose window matrix would be huge is refused before numpy
allocates it, with the error of any op over a limit (``limit_exceeded`` over the per-op cap,
``quota_exceeded`` when the session's other tensors leave no room for it), sent op by op or
registered in a graph; the session goes on and the accounting returns to where it was."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import client
from client.autodiff.extension import extension_of
from client.device import new_handle
from protocol import ErrorCode, TensorMeta
from protocol.graphs import GraphDef, GraphTensor
from protocol.ops import Conv, RunGraph

from .raw import Witness
from .test_limits import MIB, dev, limited, witness  # noqa: F401 - the fixtures

pytestmark = pytest.mark.wire

VALID = {"stride": (1, 1), "padding": ((0, 0), (0, 0)), "dilation": (1, 1), "groups": 1}
# 256 KiB of input and a 16x16 kernel over 64 channels: 18 MiB of windows for a 1 KiB result
X, W, Y = (1, 64, 32, 32), (1, 64, 16, 16), (1, 1, 17, 17)
BOMBS: dict[str, Callable[[Any, Any], Any]] = {
    "conv": lambda ext, xp: ext.conv(
        xp.ones(X, dtype=xp.float32), xp.ones(W, dtype=xp.float32), **VALID
    ),
    "conv_weight_grad": lambda ext, xp: ext.conv_weight_grad(
        xp.ones(X, dtype=xp.float32), xp.ones(Y, dtype=xp.float32), kernel=W[2:], **VALID
    ),
}


def _session_goes_on(xp: client.Namespace) -> None:
    """A small convolution runs, and gives numpy's numbers."""
    x, w = np.arange(32.0).reshape(1, 2, 4, 4), np.ones((3, 2, 2, 2))
    got = extension_of(xp).conv(xp.asarray(x), xp.asarray(w), **VALID).numpy()
    np.testing.assert_array_equal(got, extension_of(np).conv(x, w, **VALID))


@pytest.mark.parametrize("name", BOMBS)
def test_a_window_matrix_over_the_per_op_cap_is_refused_before_numpy(
    dev: client.RemoteDevice,  # noqa: F811
    witness: Witness,  # noqa: F811
    name: str,
) -> None:
    xp = client.namespace(dev)
    before = dev.stats()
    with pytest.raises(client.RemoteError) as info:
        BOMBS[name](extension_of(xp), xp).numpy()
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED
    assert "of scratch while it runs; the per-op limit is 1048576" in str(info.value)
    _session_goes_on(xp)
    del info
    gc.collect()
    after = dev.stats()
    assert (after.tensor_bytes, after.tensors) == (before.tensor_bytes, before.tensors)
    witness.assert_intact()


def test_scratch_is_reserved_against_the_session_s_quota(
    dev: client.RemoteDevice,  # noqa: F811
    witness: Witness,  # noqa: F811
) -> None:
    """With 3.5 of its 4 MiB held, a convolution whose result is 324 bytes but whose window
    matrix is 0.7 MiB is refused; once 1 MiB is let go, it runs."""
    xp = client.namespace(dev)
    ext = extension_of(xp)
    held = [xp.full((MIB // 8,), 1.0) for _ in range(3)] + [xp.full((MIB // 16,), 1.0)]
    x, w = np.ones((1, 32, 16, 16), np.float32), np.ones((1, 32, 8, 8), np.float32)
    refused = ext.conv(xp.asarray(x), xp.asarray(w), **VALID)
    with pytest.raises(client.RemoteError) as info:
        refused.numpy()
    assert info.value.code == ErrorCode.QUOTA_EXCEEDED
    del held[0], refused, info
    gc.collect()
    ran = ext.conv(xp.asarray(x), xp.asarray(w), **VALID).numpy()
    np.testing.assert_array_equal(ran, extension_of(np).conv(x, w, **VALID))
    del held, ran
    gc.collect()
    stats = dev.stats()
    assert (stats.tensor_bytes, stats.tensors) == (0, 0)
    witness.assert_intact()


def test_a_graph_holding_a_convolution_bomb_is_refused_at_registration(
    dev: client.RemoteDevice,  # noqa: F811
    witness: Witness,  # noqa: F811
) -> None:
    """Each op of a graph is checked at registration as it would be sent alone, its scratch
    included: every run of the graph fails with that error, naming the op."""
    xp = client.namespace(dev)

    def tensor(name: str, tensor_id: int, shape: tuple[int, ...]) -> GraphTensor:
        return GraphTensor(name=name, id=tensor_id, shape=shape, dtype="float32")

    graph = GraphDef(
        inputs=[tensor("x", 0, X), tensor("w", 1, W)],
        ops=[Conv(out=2, x=0, w=1, **VALID)],
        outputs=[tensor("y", 2, Y)],
    )
    x, w = xp.ones(X, dtype=xp.float32), xp.ones(W, dtype=xp.float32)
    graph_id = dev.new_graph_id()
    dev.register_graph(graph_id, graph, [])
    out = dev.new_id()
    dev.submit(RunGraph(out=out, graph=graph_id, args=(x.tensor_id, w.tensor_id)))
    with pytest.raises(client.RemoteError) as info:
        new_handle(dev, out, TensorMeta(Y, "float32")).numpy()
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED
    assert "op 0 (conv" in str(info.value) and "scratch" in str(info.value)
    _session_goes_on(xp)
    dev.drop_graph(graph_id)
    del x, w, info
    gc.collect()
    witness.assert_intact()
