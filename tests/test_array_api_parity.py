"""Where remote arrays behave as numpy's and array_api_strict's do, through a real server:
fill values of ``full``, creation dtypes, iteration (one read), ``format``, ``copy`` and
``pickle``, error types and words, and numpy's ufuncs."""

from __future__ import annotations

import copy
import pickle
import re
from collections.abc import Iterator
from typing import Any

import array_api_strict as strict
import numpy as np
import pytest
from scipy.special import _ufuncs as special_ufuncs  # the raw ufuncs, not the xp wrappers

import client
from protocol import OpArgumentError


class Counted:
    """Counts the requests (reads, describes, stats) a device sends, and its reads."""

    def __init__(self, dev: client.RemoteDevice) -> None:
        self.requests = self.reads = 0
        conn = dev._conn
        self._request = conn.request
        conn.request = self._counting  # type: ignore[method-assign]

    def _counting(self, make: Any) -> Any:
        self.requests += 1

        def counted(request_id: int) -> Any:
            message = make(request_id)
            self.reads += type(message).__name__ == "Read"
            return message

        return self._request(counted)


@pytest.fixture
def requests_of(dev: client.RemoteDevice) -> Iterator[Counted]:
    yield Counted(dev)


# --- full's fill values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fill",
    [np.float32(1.5), np.asarray(1.5), np.asarray(2, dtype=np.int16), np.float64(2.5), np.True_],
)
def test_full_takes_numpy_fill_values_with_numpy_dtype(xp: client.Namespace, fill: Any) -> None:
    got = xp.full((3,), fill).numpy()
    expected = np.full((3,), fill)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_full_takes_a_remote_0d_array_without_a_read(
    xp: client.Namespace, requests_of: Counted
) -> None:
    element = xp.asarray([1.5, 2.0], dtype=xp.float32)[0]
    filled = xp.full((3,), element)
    complex_fill = xp.full((2,), xp.asarray(1 + 2j))
    as_int = xp.full((2, 2), xp.asarray(7.9), dtype=xp.int32)
    assert requests_of.requests == 0
    assert filled.dtype == np.float32 and complex_fill.dtype == np.complex128
    np.testing.assert_array_equal(filled.numpy(), np.full((3,), np.float32(1.5)))
    np.testing.assert_array_equal(complex_fill.numpy(), np.full((2,), 1 + 2j))
    np.testing.assert_array_equal(as_int.numpy(), np.full((2, 2), np.asarray(7.9), np.int32))


def test_full_broadcasts_an_array_fill_as_numpy(xp: client.Namespace) -> None:
    got = xp.full((2, 3), xp.asarray([1, 2, 3])).numpy()
    np.testing.assert_array_equal(got, np.full((2, 3), np.asarray([1, 2, 3])))
    assert got.dtype == np.int64


def test_arguments_a_wire_model_cannot_carry_raise_a_typed_error(xp: client.Namespace) -> None:
    with pytest.raises(OpArgumentError, match="fill_value"):
        xp.full((2,), "a")
    with pytest.raises(OpArgumentError, match=r"Sort\.stable.*not str") as info:
        xp.sort(xp.asarray([2.0, 1.0]), stable="yes")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert "pydantic" not in type(info.value).__module__


# --- creation dtypes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "dtype"),
    [
        ("linspace", (0, 10, 5), "int32"),
        ("linspace", (-3.7, 10, 5), "int32"),
        ("linspace", (0, 10, 5), "uint8"),
        ("linspace", (0, 1, 3), "bool"),
        ("arange", (3,), "complex128"),
        ("arange", (0.5, 3, 0.5), "complex64"),
        ("arange", (2,), "bool"),
    ],
)
def test_creation_dtypes_numpy_and_strict_accept(
    xp: client.Namespace, name: str, args: tuple[Any, ...], dtype: str
) -> None:
    got = getattr(xp, name)(*args, dtype=getattr(xp, dtype)).numpy()
    by_numpy = getattr(np, name)(*args, dtype=np.dtype(dtype))
    by_strict = np.asarray(getattr(strict, name)(*args, dtype=getattr(strict, dtype)))
    for expected in (by_numpy, by_strict):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_arange_counts_numpy_integers_as_integers(xp: client.Namespace) -> None:
    got = xp.arange(np.int64(3)).numpy()
    assert got.dtype == np.arange(np.int64(3)).dtype
    np.testing.assert_array_equal(got, np.arange(3))


# --- iteration --------------------------------------------------------------------------------


def test_a_0d_array_is_not_iterable(xp: client.Namespace) -> None:
    x = xp.asarray(1.0)
    assert not np.iterable(x)
    with pytest.raises(TypeError, match="0-d"):
        iter(x)


def test_iterating_costs_one_read(xp: client.Namespace, requests_of: Counted) -> None:
    values = np.arange(2000.0)
    x = xp.asarray(values)
    assert np.iterable(x) and requests_of.requests == 0  # iter(x) alone reads nothing
    largest = max(x)
    smallest = min(x)
    total = sum(float(v) for v in x)
    assert requests_of.reads == 3  # each of the three iterations read x once, no more
    assert isinstance(largest, client.RemoteArray) and largest.shape == ()
    assert float(largest) == max(values) and float(smallest) == min(values)
    assert total == float(np.sum(values))
    assert requests_of.reads == 3  # and the elements' values are known: no read for them
    np.testing.assert_array_equal((largest + 1).numpy(), np.float64(2000.0))  # still an array


def test_elements_are_made_on_the_device_only_when_an_op_names_them(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    x = xp.asarray(np.arange(500.0))
    elements = list(x)
    largest, smallest = max(x), min(elements)
    assert float(largest) == 499.0 and bool(smallest < 1.0) and int(elements[7]) == 7
    assert dev.stats().tensors == 1  # x: no element, no comparison made anything there
    shifted = elements[3] - largest  # an op names them: both are made, with their values
    assert dev.stats().tensors == 4
    np.testing.assert_array_equal(shifted.numpy(), np.float64(-496.0))
    view = elements[5][...]  # indexing may write it: made first, with its value
    view += 1.0
    assert float(elements[5]) == 6.0 and float(view) == 6.0
    del elements, largest, smallest, shifted, view
    assert dev.stats().tensors == 1  # the made ones are freed, the others had nothing to free


def test_iterated_elements_are_copies_with_the_arrays_dtype(xp: client.Namespace) -> None:
    x = xp.asarray(np.asarray([3, 1, 2], dtype=np.int16))
    elements = list(x)
    x[0] = 9
    assert [e.dtype for e in elements] == [np.dtype(np.int16)] * 3
    assert [int(e) for e in elements] == [3, 1, 2]  # numpy's elements are copies too
    assert bool(elements[1] < elements[2]) and bool(elements[0] == 3)
    elements[1] += 5  # an in-place op writes the element: its value is read anew
    assert int(elements[1]) == 6 and elements[1].numpy() == np.int16(6)


def test_iterating_rows_needs_no_read(xp: client.Namespace, requests_of: Counted) -> None:
    values = np.arange(12.0).reshape(3, 4)
    rows = list(xp.asarray(values))
    assert requests_of.requests == 0 and [r.shape for r in rows] == [(4,)] * 3
    np.testing.assert_array_equal(np.stack([r.numpy() for r in rows]), values)


# --- format, copy, pickle ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", [".3g", "", "8.2f", "e"])
def test_format_of_a_0d_array_is_numpys(xp: client.Namespace, spec: str) -> None:
    value = np.asarray(np.float32(1.23456))
    assert format(xp.asarray(value), spec) == format(value, spec)
    assert f"{xp.asarray(2.5):.1f}" == "2.5"


def test_format_of_an_nd_array_takes_no_spec_as_numpys(xp: client.Namespace) -> None:
    x = xp.asarray([1.0, 2.0])
    with pytest.raises(TypeError, match="unsupported format string"):
        format(x, ".3g")
    assert format(x, "") == str(x)


def test_copies_stay_on_the_device(xp: client.Namespace, requests_of: Counted) -> None:
    x = xp.asarray([1.0, 2.0])
    deep, shallow = copy.deepcopy(x), copy.copy(x)
    assert requests_of.requests == 0
    for c in (deep, shallow):
        assert isinstance(c, client.RemoteArray) and c.device is x.device
        assert c.tensor_id != x.tensor_id
    x[0] = 5.0
    np.testing.assert_array_equal(deep.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(shallow.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_pickle_carries_the_values_as_a_numpy_array(xp: client.Namespace, protocol: int) -> None:
    values = np.asarray([[1, 2], [3, 4]], dtype=np.int32)
    restored = pickle.loads(pickle.dumps(xp.asarray(values), protocol=protocol))
    assert type(restored) is np.ndarray and restored.dtype == values.dtype
    np.testing.assert_array_equal(restored, values)
    assert pickle.loads(pickle.dumps(xp.asarray(2.5))) == np.asarray(2.5)


# --- error types and words ----------------------------------------------------------------------


def test_result_type_without_an_array_raises_as_strict(xp: client.Namespace) -> None:
    with pytest.raises(ValueError, match="at least one array or dtype is required"):
        strict.result_type(1, 2.0)
    with pytest.raises(ValueError, match="at least one array or dtype is required") as info:
        xp.result_type(1, 2.0)
    assert isinstance(info.value, TypeError)  # what it raised before, still caught


def test_broadcast_and_cast_errors_use_numpys_words(xp: client.Namespace) -> None:
    words = "operands could not be broadcast together with shapes (3,) (2,)"
    with pytest.raises(ValueError, match=re.escape(words)):
        np.ones(3) + np.ones(2)
    with pytest.raises(ValueError, match=re.escape(words)):
        xp.ones(3) + xp.ones(2)
    with pytest.raises(ValueError, match="could not be broadcast"):
        xp.broadcast_to(xp.ones(3), (2,))
    with pytest.raises(ValueError, match="could not broadcast input array from shape"):
        xp.ones((2, 3))[0, :] = xp.ones(2)
    ints = np.ones(3, dtype=np.int64)
    cast = "Cannot cast ufunc 'add' output from dtype('float64') to dtype('int64')"
    with pytest.raises(TypeError, match=re.escape(cast)):
        ints += np.ones(3)
    remote_ints = xp.ones(3, dtype=xp.int64)
    with pytest.raises(TypeError, match=re.escape(cast)):
        remote_ints += xp.ones(3)


# --- numpy's ufuncs ------------------------------------------------------------------------------


def test_numpy_ufuncs_the_server_knows_run_on_the_device(
    xp: client.Namespace, requests_of: Counted
) -> None:
    local = np.asarray([0.25, 0.5, 2.0])
    x = xp.asarray(local)
    results = {
        "exp": (np.exp(x), np.exp(local)),
        "arccos": (np.arccos(x[:2]), np.arccos(local[:2])),
        "add numpy first": (np.add(np.asarray([1.0, 2.0, 3.0]), x), np.add([1.0, 2.0, 3.0], local)),
        "operator numpy first": (np.asarray([1.0, 2.0, 3.0]) * x, [1.0, 2.0, 3.0] * local),
        "power with a scalar": (np.power(x, 2), np.power(local, 2)),
        "numpy scalar first": (np.float32(2) - x, np.float32(2) - local),
        "comparison": (np.less(local[::-1], x), np.less(local[::-1], local)),
    }
    assert requests_of.requests == 0  # all queued on the device
    for name, (remote, expected) in results.items():
        assert isinstance(remote, client.RemoteArray), name
        assert remote.dtype == expected.dtype, name
        np.testing.assert_allclose(remote.numpy(), expected, rtol=1e-15, err_msg=name)


def test_numpy_ufuncs_write_out(xp: client.Namespace) -> None:
    x = xp.asarray([1.0, 2.0])
    remote_out = xp.zeros(2)
    assert np.add(x, 1, out=remote_out) is remote_out
    np.testing.assert_array_equal(remote_out.numpy(), [2.0, 3.0])
    local = np.asarray([10.0, 20.0])
    local += x  # numpy writes the result into its own array
    np.testing.assert_array_equal(local, [11.0, 22.0])


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda x: special_ufuncs.erf(x), "erf is not one of numpy's.*np.asarray\\(x\\)"),
        (lambda x: special_ufuncs.expm1(x), "call xp.expm1\\(...\\).*np.asarray\\(x\\)"),
        (lambda x: np.add.reduce(x), "add.reduce.*call xp.sum\\(...\\)"),
        (lambda x: np.add(x, 1, where=True), "add with where=.*call xp.add"),
    ],
)
def test_other_ufuncs_say_what_to_call_instead(xp: client.Namespace, call: Any, words: str) -> None:
    x = xp.asarray([0.5, 1.0])
    with pytest.raises(TypeError, match=words):
        call(x)
    np.testing.assert_allclose(special_ufuncs.erf(np.asarray(x)), special_ufuncs.erf([0.5, 1.0]))


def test_iterating_in_a_capture_records_ops_on_the_array(dev: client.RemoteDevice) -> None:
    xp = client.namespace(dev)
    recorded = xp.asarray([1.0, 2.0, 3.0])
    with client.capture.Capture(dev) as cap:
        x = cap.input("x", recorded)
        cap.output("y", xp.stack([v * 2 for v in x]))
    replayed = cap.graph.replay(dev, {"x": xp.asarray([5.0, 6.0, 7.0])})["y"]
    np.testing.assert_array_equal(replayed.numpy(), [10.0, 12.0, 14.0])


def test_an_element_written_through_an_index_is_read_again(xp: client.Namespace) -> None:
    (element,) = xp.asarray([1.0])
    view = element[...]
    view += 1.0
    assert float(element) == 2.0 and bool(element > 1.5)


def test_a_0d_autodiff_tensor_is_not_iterable(xp: client.Namespace) -> None:
    from client.autodiff import Autodiff

    t = Autodiff(xp).tensor(xp.asarray([0.0, 1.0, 2.0]))
    assert not np.iterable(t.sum()) and np.iterable(t)
    with pytest.raises(TypeError, match="0-d"):
        iter(t.sum())


def test_ops_on_iterated_elements_and_known_arrays_need_no_read(
    xp: client.Namespace, requests_of: Counted
) -> None:
    knots = xp.asarray(np.arange(10.0))
    knots.numpy()  # its values are known from now on
    points = xp.asarray([0.5, 2.5])
    inside = [[bool(knots[i] <= x < knots[i + 1]) for i in range(4)] for x in points]
    assert inside == [[True, False, False, False], [False, False, True, False]]
    assert requests_of.reads == 2  # the knots and the points, once each
