"""Views and reads through a real server, against numpy doing the same: a write through a view
reaches its base and the base's writes reach the view (docs/array-api.md), and a
read gives an aligned, C-contiguous, writable array."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, get_args

import numpy as np
import pytest

import client
from client.array import apply_inplace
from protocol.ops import BinaryName, InPlaceBinary

# Each makes a view of a (4, 6) array the same way in numpy and in the namespace (``xp`` is
# either one), so that a write through it can be compared.
VIEW_MAKERS: dict[str, Callable[[Any, Any], Any]] = {
    "slice": lambda xp, x: x[1:3],
    "row": lambda xp, x: x[2],
    "strided": lambda xp, x: x[::2, 1::3],
    "newaxis": lambda xp, x: x[None, ..., 1],
    "reshape": lambda xp, x: xp.reshape(x, (2, 12)),
    "permute_dims": lambda xp, x: xp.permute_dims(x, (1, 0)),
    "T": lambda xp, x: x.T,
    "mT": lambda xp, x: x.mT,
    "expand_dims": lambda xp, x: xp.expand_dims(x, axis=0),
    "squeeze": lambda xp, x: xp.squeeze(x[1:2], axis=0),
    "flip": lambda xp, x: xp.flip(x, axis=1),
    "moveaxis": lambda xp, x: xp.moveaxis(x, 0, 1),
    "unstack": lambda xp, x: xp.unstack(x, axis=1)[3] if hasattr(xp, "unstack") else x[:, 3],
    "view_of_a_view": lambda xp, x: xp.reshape(x[1:3], (3, 4))[1:, ::2],
}


def _base() -> np.ndarray[Any, Any]:
    return np.arange(24.0).reshape(4, 6)


@pytest.mark.parametrize("make", list(VIEW_MAKERS), ids=list(VIEW_MAKERS))
def test_writes_through_a_view_reach_its_base_as_in_numpy(xp: client.Namespace, make: str) -> None:
    local = _base()
    remote = xp.asarray(local)
    local_view, remote_view = VIEW_MAKERS[make](np, local), VIEW_MAKERS[make](xp, remote)
    local_view[...] = -1.0
    remote_view[...] = -1.0
    local_view += 0.5
    remote_view += 0.5
    local_view[(0,) * local_view.ndim] = 100.0
    remote_view[(0,) * remote_view.ndim] = 100.0
    np.testing.assert_array_equal(remote.numpy(), local)
    np.testing.assert_array_equal(remote_view.numpy(), local_view)


@pytest.mark.parametrize("make", list(VIEW_MAKERS), ids=list(VIEW_MAKERS))
def test_writes_to_the_base_reach_its_views(xp: client.Namespace, make: str) -> None:
    local = _base()
    remote = xp.asarray(local)
    local_view, remote_view = VIEW_MAKERS[make](np, local), VIEW_MAKERS[make](xp, remote)
    remote_view.numpy()  # a read between: its reply must not pin the old values
    local[1:, 2:] *= -3.0
    remote[1:, 2:] *= -3.0
    local += 1.0
    remote += 1.0
    np.testing.assert_array_equal(remote_view.numpy(), local_view)


def test_every_write_lands_when_reads_and_writes_alternate(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """Each read's reply may hold the memory when the next write runs (the server moves it);
    the views keep following their base, and the session's bytes stay those of one base."""
    x = xp.zeros((8, 8))
    rows = [x[i] for i in range(8)]
    before = dev.stats().tensor_bytes
    expected = np.zeros((8, 8))
    for i, row in enumerate(rows):
        row[...] = float(i)
        expected[i] = i
        np.testing.assert_array_equal(x.numpy(), expected)
        x[:, i] += 1.0
        expected[:, i] += 1.0
    np.testing.assert_array_equal(np.stack([r.numpy() for r in rows]), expected)
    assert dev.stats().tensor_bytes == before  # the scalars were freed; one base


def test_a_read_only_view_is_written_into_its_own_copy(xp: client.Namespace) -> None:
    x = xp.asarray(np.arange(3.0))
    b = xp.broadcast_to(x, (2, 3))
    b[0, 0] = 5.0
    np.testing.assert_array_equal(b.numpy(), [[5, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(x.numpy(), [0, 1, 2])


def test_copies_are_not_views(xp: client.Namespace) -> None:
    x = xp.asarray(_base())
    copies = [
        xp.asarray(x, copy=True),
        xp.reshape(x, (24,), copy=True),
        x.astype(x.dtype),
        xp.astype(x, xp.float64),
        x + 0.0,
        x[xp.asarray([0, 1])],
    ]
    for c in copies:
        c[...] = 0.0
    np.testing.assert_array_equal(x.numpy(), _base())
    assert x.astype(x.dtype, copy=False) is x


def test_another_session_never_sees_a_write(url: str) -> None:
    with client.RemoteDevice(url) as one, client.RemoteDevice(url) as two:
        a = client.namespace(one).asarray(np.zeros(4))
        b = client.namespace(two).asarray(np.zeros(4))
        a[0:2][...] = 1.0
        np.testing.assert_array_equal(b.numpy(), np.zeros(4))
        np.testing.assert_array_equal(a.numpy(), [1, 1, 0, 0])


def test_to_device_copies_and_views_do_not_follow(url: str) -> None:
    with client.RemoteDevice(url) as one, client.RemoteDevice(url, index=1) as two:
        x = client.namespace(one).asarray(np.zeros(4))
        v = x[1:3]
        moved = x.to_device(two)
        v[...] = 1.0
        np.testing.assert_array_equal(moved.numpy(), np.zeros(4))
        np.testing.assert_array_equal(x.numpy(), [0, 1, 1, 0])


DTYPES = [
    "bool",
    "int8",
    "uint16",
    "int32",
    "float32",
    "int64",
    "float64",
    "complex64",
    "complex128",
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_reads_are_aligned_contiguous_writable_and_not_copied(
    xp: client.Namespace, dtype: str
) -> None:
    """Every header length and size: a small reply is a view of the received message (its
    buffer starts aligned: the header is padded), a large one its own pooled buffer."""
    for n in [0, 1, 2, 3, 5, 7, 11, 100, 1000, 70_000]:
        local = (np.arange(n) % 7).astype(dtype)
        got = xp.asarray(local).numpy()
        np.testing.assert_array_equal(got, local, strict=True)
        assert got.flags.c_contiguous and got.flags.writeable and got.flags.aligned
        assert got.ctypes.data % 16 == 0, (n, got.ctypes.data % 16)
        assert not got.flags.owndata  # not a copy made after receiving it


SAMPLES = {
    "float64": np.array([[-np.inf, -2.5, -0.0], [0.0, 3.0, np.inf], [np.nan, 7.0, 1e300]]),
    "float32": np.array([[1.5, -2.0, 0.25], [4.0, -0.0, 9.0], [np.inf, 2.0, -3.0]], np.float32),
    "int32": np.array([[1, -2, 3], [4, 5, -6], [7, 0, 9]], np.int32),
    "int64": np.array([[3, 2, 1], [-1, 7, 2], [5, 1, 4]], np.int64),
    "bool": np.array([[True, False, True], [False, False, True], [True, True, False]]),
}


@pytest.mark.parametrize("name", get_args(BinaryName))
def test_in_place_binary_ops_equal_the_op_then_a_cast(xp: client.Namespace, name: str) -> None:
    """``x op= y`` (numpy's ``out=`` where the ufunc is the whole op) gives what ``x op y``
    cast to ``x``'s dtype gives, for every dtype pair the op takes, written through a view."""
    written = 0
    for target, other in itertools.product(SAMPLES, SAMPLES):
        x, y = xp.asarray(SAMPLES[target]), xp.asarray(SAMPLES[other])
        try:
            result = getattr(xp, name)(x, y)
        except TypeError:
            continue  # no such op on these dtypes
        base = xp.asarray(np.zeros((5, 3), SAMPLES[target].dtype))
        view = base[1:4]
        view[...] = x

        def update(out: int, n: Any = name, y: client.RemoteArray = y) -> InPlaceBinary:
            return InPlaceBinary(op=n, out=out, x2=y.tensor_id)

        if not np.can_cast(result.dtype, x.dtype, casting="same_kind"):
            with pytest.raises(TypeError, match=f"in-place {name} cannot store"):
                apply_inplace(update, view, y)
            continue
        try:
            expected = xp.astype(result, x.dtype).numpy()
        except client.RemoteError:  # numpy refuses (integers to negative powers)
            apply_inplace(update, view, y)
            with pytest.raises(client.RemoteError, match=f"binary_inplace.*{name}|{name}"):
                view.numpy()
            continue
        apply_inplace(update, view, y)
        np.testing.assert_array_equal(base.numpy()[1:4], expected)
        written += 1
    assert written


def test_in_place_operators_with_overlapping_operands(xp: client.Namespace) -> None:
    local = np.arange(12.0).reshape(3, 4)
    remote = xp.asarray(local)
    local += local[::-1]
    remote += remote[::-1]
    local[1:] -= local[:-1]
    remote[1:] -= remote[:-1]
    square = np.arange(9.0).reshape(3, 3)
    r = xp.asarray(square)
    r @= r
    square @= square.copy()
    np.testing.assert_array_equal(remote.numpy(), local)
    np.testing.assert_array_equal(r.numpy(), square)


def test_a_failed_in_place_pow_leaves_the_base_untouched(xp: client.Namespace) -> None:
    """numpy's ``out=`` loop for integer pow raises part-way (negative exponents) after writing
    its buffer into ``out``; the op runs into a temporary instead, so nothing is written."""
    x = xp.ones((3, 4, 2), dtype=xp.int64)
    v = xp.permute_dims(x, (2, 0, 1))[:, ::-1, 1:3]  # not contiguous: numpy would buffer
    v **= xp.asarray(-1)
    with pytest.raises(client.RemoteError, match="negative integer powers"):
        v.numpy()
    y = xp.ones((20,), dtype=xp.int32)
    y **= xp.asarray(np.full(20, -1, np.int64))  # a cast: numpy would buffer too
    with pytest.raises(client.RemoteError):
        y.numpy()
    np.testing.assert_array_equal(x.numpy(), np.ones((3, 4, 2), np.int64))


def test_meshgrid_copies_as_numpys_does(xp: client.Namespace) -> None:
    a, b = np.arange(3.0), np.arange(2.0)
    ra, rb = xp.asarray(a), xp.asarray(b)
    grids, remote = np.meshgrid(a, b), xp.meshgrid(ra, rb)
    a[0] = 99.0
    ra[0] = 99.0
    for got, expected in zip(remote, grids, strict=True):
        np.testing.assert_array_equal(got.numpy(), expected)
