"""Errors at the user's line (client/_origins.py) through a real server: with ``origins``
(``TENSORWIRE_ORIGINS=1``) a failed op's error names the line of user code that made it,
through the namespace, autodiff and segment replay, and without it says how to; ``sync``
(``TENSORWIRE_SYNC=1``) raises it at that line; a closed device says it was closed."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import client
from client import _origins, _segments
from client.autodiff import Autodiff
from client.capture import jit

pytestmark = pytest.mark.server


def _here() -> str:
    """``File "THIS FILE", line N`` of the caller's next line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return f'File "{__file__}", line {frame.f_back.f_lineno + 1}'


def _error_of(array: Any) -> client.RemoteError:
    with pytest.raises(client.RemoteError) as info:
        np.asarray(array)
    return info.value


@pytest.fixture
def noted(url: str) -> Iterator[client.Namespace]:
    """A namespace on a device whose ops note where they were made."""
    with client.RemoteDevice(url, origins=True) as dev:
        yield client.namespace(dev)


def test_a_failed_op_names_the_line_that_made_it(noted: client.Namespace) -> None:
    xp = noted
    singular = xp.zeros((3, 3))
    where = _here()
    inverse = xp.linalg.inv(singular)
    total = xp.sum(inverse + 1.0)  # the error surfaces here, at a read of a later result
    error = _error_of(total)
    assert "inv(#" in str(error)  # the message itself is the server's, unchanged
    assert error.origin is not None and error.origin.startswith(where)
    assert error.origin.endswith("inverse = xp.linalg.inv(singular)")
    assert error.__notes__ == [f"The failed op was made at\n  {error.origin}"]
    again = _error_of(total)  # read twice: noted once
    assert again.__notes__ == error.__notes__


def test_through_autodiff_and_indexing(noted: client.Namespace) -> None:
    xp = noted
    ad = Autodiff(xp)
    w = ad.asarray(np.ones((4, 2)), requires_grad=True)
    rows = xp.asarray(np.array([0, 9]))  # 9 is out of range: the server refuses the take
    where = _here()
    picked = ad.sum(ad.take(w, rows, axis=0))
    error = _error_of(picked.array)
    assert error.origin is not None and error.origin.startswith(where), error.origin
    where = _here()
    scaled = xp.asarray(np.zeros((2, 2))).reshape(4)[np.array([7])]
    assert _error_of(scaled).origin.startswith(where)  # type: ignore[union-attr]


def test_in_a_replayed_segment(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_segments, "MIN_OPS", 1)
    with client.RemoteDevice(url, segment_replay=True, origins=True) as dev:
        xp = client.namespace(dev)
        a = xp.asarray(np.eye(3) * 2.0)
        origins = []
        for step in range(9):
            m = a * (0.0 if step == 7 else 1.0)
            inverse = xp.linalg.inv(m)
            total = xp.sum(inverse + a)
            try:
                float(total)
            except client.RemoteError as error:
                origins.append((step, error.origin))
        assert dev.segment_stats().hits >= 4
    line = (
        inspect.getsource(test_in_a_replayed_segment)
        .splitlines()
        .index("            inverse = xp.linalg.inv(m)")
    )
    number = test_in_a_replayed_segment.__code__.co_firstlineno + line
    assert origins == [
        (
            7,
            f'File "{__file__}", line {number}, in test_in_a_replayed_segment'
            "\n    inverse = xp.linalg.inv(m)",
        )
    ]


def test_sync_raises_at_the_line(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with client.RemoteDevice(url, sync=True) as dev:
        xp = client.namespace(dev)
        singular = xp.zeros((2, 2))
        with pytest.raises(client.RemoteError, match=r"inv\(#") as info:
            xp.linalg.inv(singular)
        frames = [entry.lineno for entry in info.traceback if str(entry.path) == __file__]
        assert frames[-1] + 1 == info.tb.tb_lineno  # the raise is at the op's line
        assert not hasattr(info.value, "__notes__")  # and nothing more to say
        assert float(xp.sum(singular + 1.0)) == 4.0  # ops that succeed go on as usual
    with client.RemoteDevice(url, sync=True) as dev:  # a jit step records and replays as usual
        xp = client.namespace(dev)
        w = xp.asarray(np.ones(3))
        step = jit(lambda x: xp.sum(x * w + 1.0))
        assert [float(step(xp.asarray(np.arange(3.0) + i))) for i in range(4)] == [6, 9, 12, 15]
    monkeypatch.setenv("TENSORWIRE_SYNC", "1")
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        with pytest.raises(client.RemoteError):
            xp.linalg.inv(xp.zeros((2, 2)))
    monkeypatch.setenv("TENSORWIRE_SYNC", "0")
    with client.RemoteDevice(url) as dev:
        client.namespace(dev).linalg.inv(client.namespace(dev).zeros((2, 2)))  # no wait


def test_without_notes_the_error_says_how_to_find_the_line(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        error = _error_of(xp.linalg.inv(xp.zeros((2, 2))))
        assert error.origin is None
        assert error.__notes__ == [_origins.HINT]
        assert "TENSORWIRE_ORIGINS=1" in _origins.HINT and "TENSORWIRE_SYNC=1" in _origins.HINT
    monkeypatch.setenv("TENSORWIRE_ORIGINS", "1")
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        where = _here()
        inverse = xp.linalg.inv(xp.zeros((2, 2)))
        assert (_error_of(inverse).origin or "").startswith(where)


def _noted(origins: _origins.Origins, tensor_id: int) -> None:
    """Note ``tensor_id`` from as deep as the SDK notes (a handle made by an op's function)."""

    def handle_made() -> None:
        origins.note(tensor_id)

    handle_made()


def test_a_note_lasts_for_the_ring() -> None:
    origins = _origins.Origins(on=True)
    where = _here()
    _noted(origins, 5)
    assert (origins.where(5) or "").startswith(where)
    _noted(origins, 5 + _origins.MOST)  # the same slot, a later id
    assert origins.where(5) is None


def test_use_after_close_says_the_device_was_closed(url: str) -> None:
    dev = client.RemoteDevice(url)
    xp = client.namespace(dev)
    x = xp.ones(3)
    t = Autodiff(xp).asarray(np.ones(2), requires_grad=True)
    dev.close()
    for use in (lambda: xp.ones(2), lambda: x.numpy(), lambda: x + 1.0, dev.sync):
        with pytest.raises(client.DeviceClosedError, match=r"closed by close\(\)") as info:
            use()
        assert isinstance(info.value, client.ConnectionLost)  # what code catches today
    assert repr(x).startswith("RemoteArray(shape=(3,), dtype=float64, id=#")  # no values left
    assert repr(t).startswith("Tensor(shape=(2,), dtype=float64, device=")
