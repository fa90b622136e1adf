"""What arrays show (client/_printing.py) through a real server: ``repr`` and ``str`` of remote
arrays and autodiff tensors print their values as numpy does, a large array summarised from its
corners alone, and printing can be turned off so that nothing is read."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

import client
from client.autodiff import Autodiff

from .servers import ROOT

pytestmark = pytest.mark.server


@pytest.fixture
def reads(dev: client.RemoteDevice, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The shapes of the arrays read from ``dev`` while the test runs."""
    futures: list[Future[np.ndarray[Any, Any]]] = []
    read = dev.submit_read

    def counted(tensor_id: int) -> Future[np.ndarray[Any, Any]]:
        futures.append(read(tensor_id))
        return futures[-1]

    monkeypatch.setattr(dev, "submit_read", counted)
    yield Shapes(futures)


class Shapes(list[Any]):
    """The shapes of the arrays that ``futures`` read, when compared."""

    def __init__(self, futures: list[Future[np.ndarray[Any, Any]]]) -> None:
        super().__init__()
        self.futures = futures

    def __eq__(self, other: object) -> bool:
        return [f.result().shape for f in self.futures] == other

    __hash__ = None  # type: ignore[assignment]


def test_small_arrays_print_as_numpy_does(xp: client.Namespace, dev: client.RemoteDevice) -> None:
    values = np.arange(6, dtype=np.float32).reshape(2, 3) / 3
    x = xp.asarray(values)
    assert str(x) == str(values)
    body = np.array2string(values, separator=", ", prefix="RemoteArray(")
    assert repr(x) == f"RemoteArray({body}, dtype=float32, device={dev!r})"
    assert repr(xp.asarray(np.int64(7))) == f"RemoteArray(7, dtype=int64, device={dev!r})"
    assert str(xp.asarray(2.5)) == str(np.array(2.5)) == "2.5"
    assert str(xp.asarray([True, False])) == "[ True False]"


@pytest.mark.parametrize("shape", [(5000,), (1000, 2000), (3, 500, 4), (2, 600, 1), (1001,)])
def test_large_arrays_are_summarised_from_their_corners(
    xp: client.Namespace, dev: client.RemoteDevice, reads: list[Any], shape: tuple[int, ...]
) -> None:
    size = int(np.prod(shape))
    values = np.arange(size, dtype=np.float64).reshape(shape) * 1.5
    x = xp.reshape(xp.arange(size, dtype=xp.float64), shape) * 1.5
    assert str(x) == str(values)
    body = np.array2string(values, separator=", ", prefix="RemoteArray(")
    assert repr(x) == f"RemoteArray({body}, dtype=float64, device={dev!r})"
    edge = np.get_printoptions()["edgeitems"]
    assert reads == [tuple(min(d, 2 * edge + 1) for d in shape)] * 2  # corners, not the whole


def test_print_options_apply(xp: client.Namespace, reads: list[Any]) -> None:
    values = np.linspace(0, 1, 300).reshape(30, 10)
    x = xp.asarray(values)
    with np.printoptions(threshold=50, edgeitems=2, precision=2):
        assert str(x) == str(values)
        assert reads == [(5, 5)]


def test_printing_values_can_be_turned_off(
    xp: client.Namespace, dev: client.RemoteDevice, reads: list[Any]
) -> None:
    x = xp.ones((2, 3))
    with client.print_values(False):
        text = repr(x)
        assert str(x) == text
        expected = f"RemoteArray(shape=(2, 3), dtype=float64, id=#{x.tensor_id}, device={dev!r})"
        assert text == expected
    assert reads == []
    assert "1., 1., 1." in repr(x)  # on again after the block
    client.print_values(False)  # as a function: for the rest of the context
    try:
        assert "id=#" in repr(x)
    finally:
        client.print_values(True)


def test_the_environment_turns_printing_off(url: str) -> None:
    code = (
        f"import client; dev = client.RemoteDevice({url!r}); x = client.namespace(dev).ones(3); "
        "print(repr(x)); print(x); dev.close()"
    )
    env = {**os.environ, "TENSORWIRE_PRINT_VALUES": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("RemoteArray(shape=(3,), dtype=float64, id=#")
    assert "1." not in out.stdout


def test_tensors_print_their_values(xp: client.Namespace, dev: client.RemoteDevice) -> None:
    ad = Autodiff(xp)
    w = ad.asarray(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)
    loss = ad.sum(w * 3.0)
    assert repr(w) == f"Tensor([1., 2.], dtype=float32, device={dev!r}, requires_grad=True)"
    assert repr(loss) == f"Tensor(9., dtype=float32, device={dev!r}, requires_grad=True, op=sum)"
    assert str(w) == "[1. 2.]" and str(loss) == "9.0"
    with client.print_values(False):
        assert repr(loss).startswith("Tensor(shape=(), dtype=float32")
    local = Autodiff(np).asarray(np.arange(3.0))
    assert repr(local) == "Tensor([0., 1., 2.], dtype=float64, device='cpu')"
    big = ad.asarray(np.arange(4000.0).reshape(2, 2000))
    assert str(big) == str(np.arange(4000.0).reshape(2, 2000))


def test_tensors_give_their_values(xp: client.Namespace) -> None:
    ad = Autodiff(xp)
    w = ad.asarray(np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32), requires_grad=True)
    loss = ad.mean(w)
    values = np.asarray(loss)
    assert values.dtype == np.float32 and values.shape == () and values == 2.5
    assert np.asarray(w, dtype=np.float64).dtype == np.float64
    assert loss.item() == 2.5 and isinstance(loss.item(), float)
    assert w.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert w.item(3) == 4.0 and w.item(1, 0) == 3.0
    with pytest.raises(ValueError, match="size 1"):
        w.item()


def test_remote_arrays_give_items_and_lists(xp: client.Namespace, reads: list[Any]) -> None:
    x = xp.reshape(xp.arange(12, dtype=xp.int32), (3, 4))
    assert x.item(5) == 5 and x.item((2, 3)) == 11 and x.item(-1) == 11
    assert isinstance(x.item(5), int)
    assert reads == [(), (), (), ()]  # an item reads that element alone
    assert x.tolist() == np.arange(12).reshape(3, 4).tolist()
    assert x.item(7) == 7 and reads == [(), (), (), (), (3, 4)]  # now known: no read
    assert xp.asarray([2.5]).item() == 2.5
    with pytest.raises(ValueError, match="size 1"):
        x.item()
