"""Each function family of the Array API namespace against local numpy, through a real server.

Values must match numpy bit for bit where numpy is exact (NaNs in the same places), and within
a tolerance for linalg and fft.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import client
from protocol.dtypes import DTYPES

from .servers import ServerProcess

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
NUMERIC = [d for d in DTYPES if d != "bool"]  # the standard's, as the protocol names them
REAL = [d for d in NUMERIC if not d.startswith("complex")]
FLOAT = ["float32", "float64"]


@pytest.fixture(scope="module")
def mdev(server: ServerProcess) -> Iterator[client.RemoteDevice]:
    with client.RemoteDevice(server.url) as device:
        yield device


@pytest.fixture
def rx(mdev: client.RemoteDevice) -> client.Namespace:
    return client.namespace(mdev)


def arrays(dtypes: list[str], shape: Any = None, **kw: Any) -> st.SearchStrategy[Any]:
    shapes = shape if shape is not None else hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)
    dtype = st.sampled_from(dtypes).map(np.dtype)
    return dtype.flatmap(lambda d: hnp.arrays(d, shapes, **kw))


def same(remote: Any, expected: Any) -> None:
    got = remote.numpy()
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected, strict=True)


def close(remote: Any, expected: Any, rtol: float = 1e-5) -> None:
    got = remote.numpy()
    assert got.shape == np.shape(expected) and got.dtype == np.asarray(expected).dtype
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)


# --- element-wise -----------------------------------------------------------------------------

UNARY = [
    "abs",
    "negative",
    "sign",
    "square",
    "sqrt",
    "exp",
    "log1p",
    "sin",
    "tanh",
    "floor",
    "trunc",
    "isnan",
    "isfinite",
    "signbit",
    "round",
]


@SETTINGS
@given(x=arrays(FLOAT + ["int16", "uint8"]), name=st.sampled_from(UNARY))
def test_unary(rx: client.Namespace, x: np.ndarray[Any, Any], name: str) -> None:
    fn = getattr(np, name)
    with np.errstate(all="ignore"):
        try:
            expected = fn(x)
        except TypeError:
            return
    if expected.dtype == np.float16:
        return  # Tensorwire computes in float64 instead (docs/array-api.md)
    same(getattr(rx, name)(rx.asarray(x)), expected)


@SETTINGS
@given(
    x=arrays(REAL, shape=st.just((3,)), elements={"allow_nan": False}),
    scalar=st.one_of(st.integers(0, 3), st.floats(-2, 2), st.booleans()),  # in every range
    name=st.sampled_from(["add", "multiply", "subtract", "maximum", "less", "equal"]),
)
def test_binary_with_python_scalars(
    rx: client.Namespace, x: np.ndarray[Any, Any], scalar: Any, name: str
) -> None:
    """Python scalars are weak: the array's dtype wins where the scalar's kind fits."""
    if isinstance(scalar, float) and x.dtype.kind in "iu":
        expected_dtype = np.float64
    else:
        expected_dtype = None
    with np.errstate(all="ignore"):
        expected = getattr(np, name)(x, scalar)
    if expected_dtype is not None:
        expected = getattr(np, name)(x.astype(np.float64), scalar)
    same(getattr(rx, name)(rx.asarray(x), scalar), expected)


def test_floor_divide_special_cases_follow_the_standard(rx: client.Namespace) -> None:
    x1 = np.array([np.inf, -np.inf, 3.0, -3.0, 5.0])
    x2 = np.array([2.0, 2.0, -np.inf, np.inf, 2.0])
    same(rx.asarray(x1) // rx.asarray(x2), [np.inf, -np.inf, -0.0, -0.0, 2.0])


def test_complex_special_cases_follow_the_standard(rx: client.Namespace) -> None:
    inf, nan = np.inf, np.nan
    x = np.array([complex(inf, 3.0), complex(-inf, 2.0), complex(1.0, 2.0)])
    same(rx.tanh(rx.asarray(x)), np.array([1 + 0j, -1 + 0j, np.tanh(x[2])]))
    x = np.array([complex(-0.0, 0.0), complex(inf, 0.0), complex(-inf, inf), complex(nan, 0.0)])
    got = rx.expm1(rx.asarray(x)).numpy()
    np.testing.assert_array_equal(got, [0j, complex(inf, 0.0), -1 + 0j, complex(nan, 0.0)])
    assert not np.signbit(got[0].real)


def test_clip_keeps_the_dtype(rx: client.Namespace) -> None:
    x = np.array([-5, 0, 7], dtype=np.int8)
    same(rx.clip(rx.asarray(x), min=-2, max=1000), np.array([-2, 0, 7], dtype=np.int8))


# --- reductions, sorting, cumulative ----------------------------------------------------------


@SETTINGS
@given(
    x=arrays(FLOAT, elements={"allow_nan": False, "min_value": -100, "max_value": 100}),
    correction=st.sampled_from([0, 1]),
)
def test_var_std_with_correction(
    rx: client.Namespace, x: np.ndarray[Any, Any], correction: int
) -> None:
    if x.size <= correction:
        return
    close(rx.var(rx.asarray(x), correction=correction), np.var(x, ddof=correction), 1e-4)
    close(rx.std(rx.asarray(x), correction=correction), np.std(x, ddof=correction), 1e-4)


@SETTINGS
@given(
    x=arrays(
        REAL,
        shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=6),
        elements={"allow_nan": False},
    ),
    descending=st.booleans(),
)
def test_sort_and_stable_argsort(
    rx: client.Namespace, x: np.ndarray[Any, Any], descending: bool
) -> None:
    a = rx.asarray(x)
    if descending:
        # Python's sort keeps equal elements in order with reverse=True: the standard's rule
        rows = x.reshape(-1, x.shape[-1])
        order = [sorted(range(len(r)), key=r.__getitem__, reverse=True) for r in rows]
        same(rx.argsort(a, descending=True), np.array(order, dtype=np.int64).reshape(x.shape))
        same(rx.sort(a, descending=True), np.flip(np.sort(x, axis=-1), axis=-1))
    else:
        same(rx.argsort(a), np.argsort(x, axis=-1, kind="stable"))
        same(rx.sort(a), np.sort(x, axis=-1))


@SETTINGS
@given(
    x=arrays(["int32", "float64", "uint8"], shape=hnp.array_shapes(min_dims=1, max_dims=1)),
    include_initial=st.booleans(),
)
def test_cumulative_sum(
    rx: client.Namespace, x: np.ndarray[Any, Any], include_initial: bool
) -> None:
    with np.errstate(all="ignore"):  # float overflow to inf is a value like any other
        expected = np.cumulative_sum(x, include_initial=include_initial)
    same(rx.cumulative_sum(rx.asarray(x), include_initial=include_initial), expected)


def test_searchsorted(rx: client.Namespace) -> None:
    x1, x2 = np.array([1.0, 2.0, 2.0, 5.0]), np.array([[2.0, 0.0], [6.0, 2.5]])
    for side in ("left", "right"):
        same(
            rx.searchsorted(rx.asarray(x1), rx.asarray(x2), side=side),
            np.searchsorted(x1, x2, side=side),
        )


# --- data-dependent shapes --------------------------------------------------------------------


@SETTINGS
@given(x=arrays(["int8", "float64", "bool"], elements={"allow_nan": False}))
def test_unique_and_nonzero(rx: client.Namespace, x: np.ndarray[Any, Any]) -> None:
    a = rx.asarray(x)
    u = rx.unique_all(a)
    e = np.unique_all(x)
    same(u.values, e.values)
    same(u.counts, e.counts)
    same(u.inverse_indices, e.inverse_indices.reshape(x.shape))
    same(rx.unique_values(a), e.values)  # numpy 2.3+ unique_values does not sort
    if x.ndim:
        for got, want in zip(rx.nonzero(a), np.nonzero(x), strict=True):
            same(got, want)


def test_data_dependent_shape_is_known_on_return(rx: client.Namespace) -> None:
    x = rx.asarray(np.array([[0, 3], [4, 0]]))
    (rows, cols) = rx.nonzero(x)
    assert rows.shape == (2,) and cols.shape == (2,)
    assert x[x > 0].shape == (2,)
    assert rx.__array_namespace_info__().capabilities()["data-dependent shapes"] is True


# --- manipulation -----------------------------------------------------------------------------


@SETTINGS
@given(
    x=arrays(["float32", "int64"], shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4)),
    data=st.data(),
)
def test_manipulation(rx: client.Namespace, x: np.ndarray[Any, Any], data: st.DataObject) -> None:
    a = rx.asarray(x)
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    same(rx.flip(a, axis=axis), np.flip(x, axis=axis))
    same(rx.roll(a, 2, axis=axis), np.roll(x, 2, axis=axis))
    same(rx.expand_dims(a, axis=0), np.expand_dims(x, 0))
    same(rx.concat([a, a], axis=axis), np.concatenate([x, x], axis=axis))
    same(rx.concat([a, a], axis=None), np.concatenate([x, x], axis=None))
    same(rx.stack([a, a], axis=axis), np.stack([x, x], axis=axis))
    same(rx.moveaxis(a, 0, -1), np.moveaxis(x, 0, -1))
    same(rx.tile(a, (2,)), np.tile(x, (2,)))
    same(rx.repeat(a, 2, axis=axis), np.repeat(x, 2, axis=axis))
    counts = np.arange(x.shape[axis]) % 3  # array repeats: a data-dependent length
    same(rx.repeat(a, rx.asarray(counts), axis=axis), np.repeat(x, counts, axis=axis))
    same(rx.broadcast_to(a, (2, *x.shape)), np.broadcast_to(x, (2, *x.shape)))
    for got, want in zip(rx.unstack(a, axis=axis), np.unstack(x, axis=axis), strict=True):
        same(got, want)
    if x.ndim >= 2:
        same(rx.tril(a, k=-1), np.tril(x, k=-1))
        same(rx.triu(a), np.triu(x))


# --- indexing ---------------------------------------------------------------------------------


@SETTINGS
@given(
    x=arrays(["int16", "float64"], shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=5)),
    data=st.data(),
)
def test_integer_array_and_mask_indexing(
    rx: client.Namespace, x: np.ndarray[Any, Any], data: st.DataObject
) -> None:
    a = rx.asarray(x)
    idx = data.draw(hnp.arrays(np.int64, (3,), elements=st.integers(0, x.shape[0] - 1)), "idx")
    same(a[rx.asarray(idx)], x[idx])
    same(a[rx.asarray(idx), ...], x[idx, ...])
    if x.ndim >= 2:
        same(a[:, rx.asarray(idx % x.shape[1])], x[:, idx % x.shape[1]])
        same(a[rx.asarray(idx), rx.asarray(idx % x.shape[1])], x[idx, idx % x.shape[1]])
    mask = data.draw(hnp.arrays(np.bool_, x.shape), "mask")
    same(a[rx.asarray(mask)], x[mask])
    same(rx.take(a, rx.asarray(idx), axis=0), np.take(x, idx, axis=0))


@SETTINGS
@given(
    x=arrays(["int32", "float32"], shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=5)),
    data=st.data(),
)
def test_setitem_keeps_identity_and_matches_numpy(
    rx: client.Namespace, x: np.ndarray[Any, Any], data: st.DataObject
) -> None:
    a = rx.asarray(x)
    expected = x.copy()
    # A row of a matrix is a view, as in numpy; an element of a 1-d array is a copy (numpy
    # gives a scalar): either way it must end as numpy's does.
    view, expected_view = a[0], expected[0]
    tensor_id = a.tensor_id
    i = data.draw(st.integers(0, x.shape[0] - 1), "i")
    a[i] = 7
    expected[i] = 7
    middle = a[...]  # a view of a's memory: it sees the later updates, as in numpy
    mask = data.draw(hnp.arrays(np.bool_, x.shape), "mask")
    a[rx.asarray(mask)] = 3
    expected[mask] = 3
    a[1:] = rx.asarray(x[:-1])
    expected[1:] = x[:-1]
    assert a.tensor_id == tensor_id
    same(a, expected)
    same(view, expected_view)
    same(middle, expected)


def test_repeated_setitem_after_a_read_keeps_every_write(rx: client.Namespace) -> None:
    """Each read's reply may still hold the bytes when the next update runs (the server then
    moves the memory first); no update is lost."""
    a = rx.zeros((4,), dtype=rx.int64)
    for i in range(4):
        a[i] = i + 1
        assert a.numpy()[i] == i + 1
    a[0] = 9
    same(a, np.array([9, 2, 3, 4]))
    b = a + 0
    a[1] = 0
    same(b, np.array([9, 2, 3, 4]))


def test_a_failed_update_fails_the_array_and_names_the_op(rx: client.Namespace) -> None:
    """Index values are only known on the server: an out-of-bounds index array fails the
    in-place op there, and the updated array reports it."""
    a = rx.asarray(np.arange(3))
    a[rx.asarray(np.array([5]))] = 1
    with pytest.raises(client.RemoteError, match="setitem") as err:
        a.numpy()
    assert err.value.code == "execution_failed"


def test_inplace_operators_keep_identity(rx: client.Namespace) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = rx.asarray(x)
    tensor_id = a.tensor_id
    a += 1
    a *= rx.asarray(np.float32(2))
    a -= rx.ones((3,), dtype=rx.float32)
    assert a.tensor_id == tensor_id and a.dtype == np.float32
    same(a, (x + 1) * 2 - 1)
    i = rx.asarray(np.arange(4, dtype=np.int8))
    with pytest.raises(TypeError):
        i /= 2  # float result into an integer array
    with pytest.raises(ValueError):
        b = rx.ones((3,))
        b += rx.ones((2, 3))


# --- linalg and fft ---------------------------------------------------------------------------


@SETTINGS
@given(x=hnp.arrays(np.float64, st.sampled_from([(3, 3), (2, 4, 4)]), elements=st.floats(-10, 10)))
def test_linalg(rx: client.Namespace, x: np.ndarray[Any, Any]) -> None:
    a = rx.asarray(x)
    spd = x @ np.swapaxes(x, -1, -2) + 10 * np.eye(x.shape[-1])
    s = rx.asarray(spd)
    close(rx.linalg.cholesky(s), np.linalg.cholesky(spd))
    close(rx.linalg.inv(s), np.linalg.inv(spd))
    close(rx.linalg.det(a), np.linalg.det(x), 1e-6)
    close(rx.linalg.svdvals(a), np.linalg.svdvals(x))
    close(rx.linalg.eigh(s).eigenvalues, np.linalg.eigvalsh(spd))
    q, r = rx.linalg.qr(a)
    close(q @ r, x)
    close(rx.linalg.solve(s, a), np.linalg.solve(spd, x))
    close(rx.linalg.vector_norm(a, axis=-1), np.linalg.vector_norm(x, axis=-1))
    close(rx.linalg.matrix_norm(a), np.linalg.matrix_norm(x))
    same(rx.linalg.diagonal(a, offset=1), np.linalg.diagonal(x, offset=1))
    same(rx.vecdot(a, a), np.vecdot(x, x))
    close(rx.tensordot(a, a, axes=([-1], [-2])), np.tensordot(x, x, axes=([-1], [-2])))


def test_an_array_rtol_broadcasts_in_matrix_rank_and_must_fit_in_pinv(
    rx: client.Namespace,
) -> None:
    """Found by test_fuzz: an rtol larger than the batch gives one rank per rtol (numpy and
    array-api-strict agree), and pinv, where numpy fails after the SVD, refuses it first (the
    client checks every op as it is made, as the server does again)."""
    x = np.arange(12.0).reshape(3, 4) / 7
    rtol = np.linspace(0.001, 0.9, 12).reshape(3, 4)
    a, r = rx.asarray(x), rx.asarray(rtol)
    same(rx.linalg.matrix_rank(a, rtol=r), np.linalg.matrix_rank(x, rtol=rtol))
    batched = np.stack([x, 2 * x])
    close(
        rx.linalg.pinv(rx.asarray(batched), rtol=rx.asarray(np.array([0.01, 0.5]))),
        np.linalg.pinv(batched, rtol=np.array([0.01, 0.5])),
    )
    with pytest.raises(ValueError, match="does not broadcast"):  # checked at the call
        rx.linalg.pinv(a, rtol=r)


@SETTINGS
@given(x=hnp.arrays(np.float64, st.sampled_from([(8,), (3, 4)]), elements=st.floats(-5, 5)))
def test_fft(rx: client.Namespace, x: np.ndarray[Any, Any]) -> None:
    a = rx.asarray(x)
    close(rx.fft.fft(a), np.fft.fft(x))
    close(rx.fft.rfft(a), np.fft.rfft(x))
    close(rx.fft.irfft(rx.fft.rfft(a), n=x.shape[-1]), x)
    close(rx.fft.fftn(a), np.fft.fftn(x))
    same(rx.fft.fftshift(a), np.fft.fftshift(x))
    close(rx.fft.fftfreq(5, d=0.5), np.fft.fftfreq(5, d=0.5))


# --- the namespace itself ---------------------------------------------------------------------


def test_inspection_api(rx: client.Namespace, mdev: client.RemoteDevice) -> None:
    info = rx.__array_namespace_info__()
    assert rx.__array_api_version__ == "2024.12"
    assert info.default_device() is mdev and info.devices() == [mdev]
    assert set(info.dtypes()) == set(NUMERIC) | {"bool"}
    assert set(info.dtypes(kind="real floating")) == {"float32", "float64"}
    assert info.default_dtypes()["indexing"] == np.int64
    assert rx.isdtype(rx.int8, "signed integer") and not rx.isdtype(rx.uint8, "signed integer")
    assert isinstance(rx.finfo(rx.float32).eps, float)
    assert rx.asarray([1.0]).__array_namespace__().device is mdev
    assert rx.asarray([1.0]).__array_namespace__() is client.namespace(mdev)


def test_devices_must_match_and_to_device_moves(server: ServerProcess) -> None:
    with client.RemoteDevice(server.url) as d0, client.RemoteDevice(server.url, index=1) as d1:
        x0 = client.namespace(d0).asarray([1.0, 2.0])
        x1 = client.namespace(d1).asarray([3.0, 4.0])
        with pytest.raises(ValueError, match="different devices"):
            x0 + x1
        moved = x0.to_device(d1)
        assert moved.device is d1 and x0.to_device(d0) is x0
        same(moved + x1, np.array([4.0, 6.0]))


def test_dlpack_exports_a_host_copy(rx: client.Namespace) -> None:
    x = rx.asarray(np.arange(3.0))
    np.testing.assert_array_equal(np.from_dlpack(x), np.arange(3.0))
    with pytest.raises(BufferError):
        x.__dlpack__(copy=False)


def test_numpy_integers_are_accepted_as_python_ints(rx: client.Namespace) -> None:
    """The wire's models are strict; the namespace converts numpy integers itself."""
    i: Any = np.int64  # numpy's stubs type these as numpy ints, which is the point
    x = np.arange(12.0).reshape(3, 4)
    a = rx.asarray(x)
    same(rx.linspace(0, 1, i(5)), np.linspace(0, 1, 5))
    same(rx.sort(a, axis=i(0)), np.sort(x, axis=0))
    same(rx.concat([a, a], axis=i(1)), np.concatenate([x, x], axis=1))
    same(rx.eye(i(3), i(2), k=i(1)), np.eye(3, 2, k=1))
    same(rx.tril(a, k=i(1)), np.tril(x, k=1))
    same(rx.cumulative_sum(a, axis=i(1)), np.cumulative_sum(x, axis=1))
    same(rx.take(a, rx.asarray(np.array([0])), axis=i(1)), np.take(x, [0], axis=1))
    same(rx.linalg.diagonal(a, offset=i(1)), np.linalg.diagonal(x, offset=1))
    same(rx.vecdot(a, a, axis=i(0)), np.sum(x * x, axis=0))


def test_several_data_dependent_outputs_cost_one_round_trip(
    rx: client.Namespace, mdev: client.RemoteDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """unique_all has three outputs of unknown length: the client sends the three describe
    requests before it waits for any reply."""
    events: list[str] = []
    request = mdev._conn.request

    def recording(make: Any) -> Any:
        future = request(make)
        events.append("request")
        result = future.result

        def waiting(*args: Any) -> Any:
            events.append("wait")
            return result(*args)

        future.result = waiting  # type: ignore[assignment]
        return future

    x = rx.asarray(np.array([3, 1, 3, 2]))
    monkeypatch.setattr(mdev._conn, "request", recording)
    u = rx.unique_all(x)
    assert events == ["request"] * 3 + ["wait"] * 3
    assert u.values.shape == (3,) and u.counts.shape == (3,) and u.indices.shape == (3,)


@pytest.mark.parametrize("k", [2**63, -(2**63), 2**100, 5, -4, 3, -3])
def test_eye_with_a_diagonal_outside_the_matrix_is_zeros(rx: client.Namespace, k: int) -> None:
    """Any such ``k`` (the conformance suite draws 2**63, beyond the wire's int64) gives the
    zeros numpy gives."""
    same(rx.eye(3, 4, k=k), np.eye(3, 4, k=max(-3, min(k, 4))))
    same(rx.eye(0, k=k), np.eye(0))
