"""numpy's array methods (client/_array_methods.py) on remote arrays and on autodiff tensors,
through a real server: each gives numpy's result for numpy's arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import client
from client.autodiff import Autodiff

pytestmark = pytest.mark.server

A = np.array([[1.5, -2.0, 0.0], [4.0, 0.5, -0.25]], dtype=np.float32)
B = np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]], dtype=np.float32)

CASES: dict[str, Callable[[Any], Any]] = {
    "sum": lambda a: a.sum(),
    "sum axis keepdims": lambda a: a.sum(axis=0, keepdims=True),
    "sum dtype": lambda a: a.sum(1, dtype=np.float64),
    "prod": lambda a: a.prod(axis=1),
    "mean": lambda a: a.mean(),
    "mean axis": lambda a: a.mean(axis=(0, 1), keepdims=True),
    "std ddof": lambda a: a.std(ddof=1),
    "var axis": lambda a: a.var(axis=1),
    "min": lambda a: a.min(),
    "max axis": lambda a: a.max(axis=1),
    "argmax": lambda a: a.argmax(),
    "argmin axis": lambda a: a.argmin(axis=0),
    "any": lambda a: (a > 3).any(),
    "all axis": lambda a: (a > -3).all(axis=1),
    "cumsum": lambda a: a.cumsum(),
    "cumsum axis": lambda a: a.cumsum(axis=1),
    "cumprod": lambda a: a.cumprod(axis=0),
    "astype": lambda a: a.astype(np.int32),
    "reshape": lambda a: a.reshape(3, 2),
    "reshape tuple": lambda a: a.reshape((-1,)),
    "transpose": lambda a: a.transpose(),
    "transpose axes": lambda a: a.transpose(1, 0),
    "T": lambda a: a.T,
    "flatten": lambda a: a.flatten(),
    "ravel": lambda a: a.ravel(),
    "squeeze": lambda a: a.reshape(1, 2, 1, 3).squeeze(),
    "squeeze axis": lambda a: a.reshape(1, 6).squeeze(axis=0),
    "copy": lambda a: a.copy(),
    "clip": lambda a: a.clip(-1, 1),
    "clip max": lambda a: a.clip(max=1.0),
    "round": lambda a: a.round(),
    "round decimals": lambda a: (a * 1.2345).round(2),
    "take": lambda a: a.take([0, 4]),
    "take axis": lambda a: a.take([1, 0], axis=1),
    "conj": lambda a: a.conj(),
}


def _remote(xp: client.Namespace, values: np.ndarray[Any, Any]) -> Any:
    return xp.asarray(values)


def _tensor(xp: client.Namespace, values: np.ndarray[Any, Any]) -> Any:
    return Autodiff(xp).asarray(values)


@pytest.mark.parametrize("make", [_remote, _tensor], ids=["RemoteArray", "Tensor"])
@pytest.mark.parametrize("case", list(CASES))
def test_methods_give_numpys_results(xp: client.Namespace, make: Any, case: str) -> None:
    expected = CASES[case](A)
    got = CASES[case](make(xp, A))
    assert type(got) is type(make(xp, A))
    values = np.asarray(got)
    assert values.dtype == expected.dtype and values.shape == expected.shape
    np.testing.assert_allclose(values, expected, rtol=1e-6)


@pytest.mark.parametrize("make", [_remote, _tensor], ids=["RemoteArray", "Tensor"])
def test_nonzero_and_dot(xp: client.Namespace, make: Any) -> None:
    a = make(xp, A)
    for got, expected in zip(a.nonzero(), A.nonzero(), strict=True):
        np.testing.assert_array_equal(np.asarray(got), expected)
    np.testing.assert_allclose(np.asarray(a.dot(make(xp, B))), A.dot(B), rtol=1e-6)
    v = A[0]
    np.testing.assert_allclose(np.asarray(make(xp, v).dot(make(xp, v))), v.dot(v), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(a.dot(2.0)), A.dot(2.0))
    c = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    d = np.arange(20, dtype=np.float32).reshape(5, 4, 1)
    np.testing.assert_allclose(np.asarray(make(xp, c).dot(make(xp, d))), c.dot(d))


def test_methods_record_gradients(xp: client.Namespace) -> None:
    ad = Autodiff(xp)
    w = ad.asarray(A, requires_grad=True)
    loss = (w * w).sum() + w.mean(axis=0).max()
    loss.backward()
    assert w.grad is not None
    expected = 2 * A + np.array([[0.5, 0, 0], [0.5, 0, 0]], dtype=np.float32)
    np.testing.assert_allclose(np.asarray(w.grad), expected, rtol=1e-6)


def test_views_between_complex_and_float(xp: client.Namespace) -> None:
    c = np.array([[1 + 2j, 3 - 4j], [0.5j, -1]], dtype=np.complex128)
    remote = xp.asarray(c)
    as_float = remote.view(float)
    np.testing.assert_array_equal(np.asarray(as_float), c.view(float))
    np.testing.assert_array_equal(np.asarray(as_float.view(complex)), c)
    small = xp.asarray(c.astype(np.complex64))
    np.testing.assert_array_equal(np.asarray(small.view(np.float32)), c.astype("c8").view("f4"))
    assert remote.view() is remote and remote.view(np.complex128) is remote
    with pytest.raises(TypeError, match="cannot be reinterpreted"):
        xp.asarray(A).view(np.int32)
    with pytest.raises(ValueError, match="even last axis"):
        xp.ones(3).view(complex)


def test_existing_aliases_keep_their_behaviour(xp: client.Namespace) -> None:
    x = xp.asarray(A)
    same = x.astype(np.float32, copy=False)
    assert same is x
    assert x.reshape([3, 2]).shape == (3, 2)
    assert x.copy().tensor_id != x.tensor_id
    assert x.max(axis=0, keepdims=True).shape == (1, 3)
