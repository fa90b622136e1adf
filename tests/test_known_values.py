"""What the client knows of its tensors' values (client._known), through a real server: reads
it need not make, and the writes after which it must make them again. Each test counts the
requests the client sends (every read, describe, sync or stats is one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from array_api_compat import is_lazy_array

import client

from .servers import run_server

DATA = np.array([3.0, -1.0, 4.0, 1.5, -5.0, 9.0, 2.0, 6.0])


@contextmanager
def requests(dev: client.RemoteDevice) -> Iterator[list[str]]:
    """The kinds of the requests ``dev`` sends inside the block, in order."""
    sent: list[str] = []
    conn: Any = dev._conn
    request: Callable[..., Any] = conn.request

    def counted(make: Callable[[int], Any], *args: Any) -> Any:
        sent.append(type(make(0)).__name__.lower())
        return request(make, *args)

    conn.request = counted
    try:
        yield sent
    finally:
        del conn.request


def computed(xp: client.Namespace) -> client.RemoteArray:
    """``DATA`` as the result of an op: values the client has not seen."""
    return xp.asarray(DATA) * 1.0


def test_a_read_array_is_converted_without_a_read_and_each_conversion_is_a_new_array(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    x = computed(xp)
    with requests(dev) as sent:
        first, second = np.asarray(x), np.asarray(x)
        assert float(x[2]) == 4.0 and bool(x[1] < 0) and int(xp.astype(x, xp.int64)[0]) == 3
        read = x.numpy()  # an explicit read asks the server (a lost session is told there)
    # x once (and the session's stats along: the upload DATA came from is now confirmed), the
    # astype's result (a new op: its values are not known), the explicit read
    assert sent == ["read", "stats", "read", "read"]
    np.testing.assert_array_equal(first, DATA)
    first[0] = 100.0  # the caller's copy: what the client keeps does not change
    np.testing.assert_array_equal(second, DATA)
    np.testing.assert_array_equal(read, DATA)
    np.testing.assert_array_equal(np.asarray(x), DATA)
    assert second.flags.writeable and first is not second


def test_writes_in_place_through_the_array_or_a_view_are_read_again(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    x = computed(xp)
    row = xp.reshape(x, (2, 4))[1]  # a view of x's memory on the server
    expected = DATA.copy()
    np.asarray(x), np.asarray(row)
    with requests(dev) as sent:
        row[1:3] = 0.0  # through the view
        expected[5:7] = 0.0
        np.testing.assert_array_equal(np.asarray(x), expected)
        x += 1.0  # through the array: its view sees it
        expected += 1.0
        np.testing.assert_array_equal(np.asarray(row), expected[4:])
        np.testing.assert_array_equal(np.asarray(x), expected)
        y = x[:4]
        y *= 2.0  # a view of a view of the same memory
        expected[:4] *= 2.0
        np.testing.assert_array_equal(np.asarray(x), expected)
        assert bool(x[0] == float(expected[0]))  # known again: no read
    assert sent == ["read", "read", "read", "read"]


def test_an_in_place_op_queued_directly_forgets_what_is_known(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    from protocol.ops import InPlaceBinaryScalar

    x = computed(xp)
    np.asarray(x)
    dev.submit(InPlaceBinaryScalar(op="add", out=x.tensor_id, scalar=1.0))
    np.testing.assert_array_equal(np.asarray(x), DATA + 1.0)


def test_a_masks_count_once_known_gives_later_indexings_their_shapes(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """SciPy's iterative solvers index many arrays by one mask and by its negation: only the
    first indexing asks the server for the shape."""
    x = computed(xp)
    other = xp.asarray(np.arange(8.0))
    with requests(dev) as sent:
        mask = x > 2.0
        picked = x[mask]
        others, rest, rest_again = other[mask], x[~mask], other[~mask]
        some, every = bool(xp.any(mask)), bool(xp.all(mask))
        none_left = bool(xp.any(~mask))
    assert sent == ["describe"]
    expected = DATA > 2.0
    assert (picked.shape, others.shape) == ((expected.sum(),),) * 2
    assert rest.shape == rest_again.shape == ((~expected).sum(),)
    assert (some, every, none_left) == (True, False, True)
    np.testing.assert_array_equal(np.asarray(others), np.arange(8.0)[expected])
    np.testing.assert_array_equal(np.asarray(rest), DATA[~expected])


def test_a_written_mask_is_described_again(dev: client.RemoteDevice, xp: client.Namespace) -> None:
    x = computed(xp)
    mask = x > 2.0
    assert x[mask].shape == ((DATA > 2.0).sum(),)
    with requests(dev) as sent:
        mask[0] = False  # it was True
        assert x[mask].shape == ((DATA > 2.0).sum() - 1,)
        assert x[~mask].shape == ((DATA <= 2.0).sum() + 1,)  # its count is known again
    assert sent == ["describe"]


def test_a_mask_reduced_by_any_is_read_along_and_indexes_without_a_describe(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """``if xp.any(stop): ... x[stop] ... x[~stop]``: the read of ``any`` brings the mask."""
    x = computed(xp)
    stop = x < 0.0
    with requests(dev) as sent:
        assert bool(xp.any(stop))
        kept, dropped = x[~stop], x[stop]
    assert sorted(sent) == ["read", "read", "stats"]  # sent together: one round trip
    assert (kept.shape, dropped.shape) == (((DATA >= 0).sum(),), ((DATA < 0).sum(),))


def test_a_small_mask_made_before_another_read_is_read_along_with_it(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """``zero = norm == 0; if is_lazy_array(norm): ... elif xp.any(zero): ...`` (SciPy's
    checks after array-api-compat's probe): the probe's read brings the mask made before it,
    so testing and indexing by the mask send nothing more."""
    x = computed(xp)
    zero = x == 0.0
    with requests(dev) as sent:
        assert not is_lazy_array(x)
        probe = len(sent)  # the probe's read, what it brings along, the session's stats
        assert not bool(xp.any(zero))
        assert x[zero].shape == (0,) and x[~zero].shape == DATA.shape
    assert "read" in sent and len(sent) == probe


def test_a_comparison_of_exact_reductions_brings_the_arrays_they_reduce(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """``max(abs(err_a)) > max(abs(err_b))``, again and again (SciPy's cubature orders its
    heap of regions so): the first comparison's read brings ``err_a`` and ``err_b``; the later
    ones are computed by the client as the server computes them, and send nothing."""
    a, b = computed(xp), computed(xp) * -0.5
    with requests(dev) as sent:
        assert bool(xp.max(xp.abs(a)) > xp.max(xp.abs(b)))
        first = len(sent)
        later = [
            float(xp.max(xp.abs(b))),
            float(xp.min(-a)),
            bool(xp.max(xp.abs(b), axis=0, keepdims=True) > xp.min(xp.negative(a))),
        ]
    assert "read" in sent and len(sent) == first
    assert later == [float(np.max(np.abs(DATA * -0.5))), float(np.min(-DATA)), True]


def test_an_element_read_brings_its_small_array_along(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """``t[i] <= x < t[i + 1]`` over a knot vector (SciPy's spline tests): the first element's
    read brings ``t``; the later elements and their comparisons send nothing."""
    t = computed(xp)
    with requests(dev) as sent:
        inside = [bool(t[i] <= 2.5 < t[i + 1]) for i in range(len(DATA) - 1)]
    assert sorted(sent) == ["read", "read", "stats"]
    assert inside == [bool(DATA[i] <= 2.5 < DATA[i + 1]) for i in range(len(DATA) - 1)]


def test_a_read_and_the_reads_it_brings_along_go_out_in_one_message(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """The read, the mask read along with it and the session's stats: one message for the
    server to take in; so are the describes of one op's outputs."""
    x = computed(xp)
    stop = x < 0.0
    conn: Any = dev._conn
    messages = conn._batches
    with requests(dev) as sent:
        assert bool(xp.any(stop))
    assert sorted(sent) == ["read", "read", "stats"]
    assert conn._batches == messages + 1
    values, counts = xp.unique_counts(computed(xp) > 0.0)  # two data-dependent shapes
    assert conn._batches == messages + 2
    assert values.shape == counts.shape == (2,)


def test_conditions_made_together_are_read_in_one_round_trip(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """``[bool(c) for c in conds]`` (SciPy's validation checks): the first read brings the
    others along; the rest of the loop sends nothing."""
    x = computed(xp)
    conds = [xp.any(x > limit) for limit in (0.0, 5.0, 8.0, 10.0)]
    with requests(dev) as sent:
        first = bool(conds[0])
        before_the_rest = len(sent)
        rest = [bool(c) for c in conds[1:]]
    assert [first, *rest] == [True, True, True, False]
    assert before_the_rest == len(sent) == 5  # 4 reads and stats together: one round trip


def test_a_failed_result_read_along_raises_when_read_itself(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    from protocol import TensorMeta
    from protocol.ops import BinaryScalar

    x = computed(xp)
    bad = dev.submit_unchecked(
        BinaryScalar(op="matmul", out=dev.new_id(), x=x.tensor_id, scalar=1.0),
        TensorMeta((), "float64"),
    )
    dev.known.note_result(bad)  # as a 0-d result of a checked op is: read along the next read
    fine = xp.sum(x)
    with requests(dev) as sent:
        assert float(fine) == DATA.sum()
    assert sent == ["read", "read", "stats"]
    with pytest.raises(client.RemoteError):
        bad.numpy()


def test_array_api_compats_lazy_probe_of_a_read_array_costs_nothing(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    x = computed(xp)
    np.asarray(x)
    with requests(dev) as sent:
        assert not is_lazy_array(x)
        assert not is_lazy_array(xp.reshape(x, (2, 4)))
    assert sent == []


def test_an_uploads_values_are_used_once_the_server_is_known_to_hold_it(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    x, y = xp.asarray(DATA), xp.asarray(np.arange(8.0))
    with requests(dev) as sent:
        assert float(xp.sum(y)) == 28.0  # the session's stats come along: no failed tensor
        np.testing.assert_array_equal(np.asarray(x), DATA)
        assert bool(x[2] > 3.0) and not is_lazy_array(x)
    assert sent == ["read", "stats"]


@pytest.mark.server
def test_a_refused_upload_is_read_from_the_server_and_raises() -> None:
    with run_server("--session-quota", "1MiB") as proc, client.RemoteDevice(proc.url) as dev:
        xp = client.namespace(dev)
        held = xp.full((2**20 // 8,), 1.0)  # the whole quota
        refused = xp.asarray(DATA)
        with pytest.raises(client.RemoteError):
            float(xp.sum(held))  # the sum is refused too; the stats along show failed tensors
        with pytest.raises(client.RemoteError) as info:
            refused.numpy()
        assert info.value.code == "quota_exceeded"
        with pytest.raises(client.RemoteError):
            bool(refused[0] > 0.0)


def test_what_is_derived_from_an_upload_before_it_is_confirmed_is_known_once_it_is(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """SciPy's ``xp_assert_close`` broadcasts the expected upload, then reads the result and
    the broadcast: the result's read confirms the upload, so the broadcast needs none."""
    desired = xp.broadcast_to(xp.asarray(DATA), (2, 8))
    above = desired > 2.0
    with requests(dev) as sent:
        np.testing.assert_array_equal(np.asarray(computed(xp)), DATA)
        np.testing.assert_array_equal(np.asarray(desired), np.broadcast_to(DATA, (2, 8)))
        assert bool(xp.any(above)) and int(xp.max(xp.abs(desired))) == 9
    assert sent == ["read", "stats"]


def test_a_search_and_index_arithmetic_on_known_arrays_need_no_read(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """SciPy's naive B-spline evaluation: ``i = searchsorted(t, x) - 1``, then ``t[i]``,
    ``t[i + 1]`` compared with the point."""
    knots = xp.asarray(np.arange(10.0))
    knots.numpy()
    (point,) = xp.asarray([2.5])
    with requests(dev) as sent:
        i = xp.searchsorted(knots, point) - 1
        assert int(i) == 2 and bool(knots[i] <= point < knots[i + 1])
        assert float(knots[i * 3]) == 6.0 and float(knots[knots > 7.5][1]) == 9.0
    assert sent == []
    with pytest.raises(client.RemoteError):  # out of bounds: the server's error, at its read
        float(knots[i + 20])


@pytest.mark.server
def test_what_is_derived_from_a_refused_upload_is_read_from_the_server_and_raises() -> None:
    with run_server("--session-quota", "1MiB") as proc, client.RemoteDevice(proc.url) as dev:
        xp = client.namespace(dev)
        held = xp.full((2**20 // 8,), 1.0)  # the whole quota
        refused = xp.broadcast_to(xp.asarray(DATA), (2, 8))
        above = refused > 0.0
        with pytest.raises(client.RemoteError):
            float(xp.sum(held))  # the sum is refused too; the stats along show failed tensors
        with pytest.raises(client.RemoteError) as info:
            np.asarray(refused)
        assert info.value.code == "quota_exceeded"
        with pytest.raises(client.RemoteError):
            bool(xp.any(above))


def test_a_mask_of_arrays_joined_or_taken_keeps_its_count_across_writes_elsewhere(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """Outputs of ops that always allocate (a join, a take) view none of their inputs: a write
    to one of them forgets nothing else."""
    x = computed(xp)
    joined = xp.concat([x, x])
    taken = xp.take(x, xp.asarray([0, 1]))
    mask = x > 2.0
    assert x[mask].shape == ((DATA > 2.0).sum(),)
    with requests(dev) as sent:
        joined[0] = 0.0
        taken[0] = 0.0
        assert x[~mask].shape == ((DATA <= 2.0).sum(),)
    assert sent == []
