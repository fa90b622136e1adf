"""``client.nn.DataLoader`` (client/nn/data.py) through a real server: batches gathered on the
device, in order or shuffled by a seed, the ragged last batch kept or dropped, ``len()``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import client
from client import nn
from client.autodiff import Autodiff

pytestmark = pytest.mark.server

X = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
Y = np.arange(10, dtype=np.int64) * 7


def _rows(batches: list[Any]) -> list[list[int]]:
    """Each batch of (x, y) as the row numbers it holds, checked against each other."""
    seen = []
    for xb, yb in batches:
        x, y = np.asarray(xb), np.asarray(yb)
        rows = (y // 7).tolist()
        np.testing.assert_array_equal(x, X[rows])
        seen.append(rows)
    return seen


def test_batches_in_order(xp: client.Namespace) -> None:
    loader = nn.DataLoader(xp.asarray(X), xp.asarray(Y), batch_size=4)
    assert len(loader) == 3
    batches = list(loader)
    assert all(type(b) is client.RemoteArray for pair in batches for b in pair)
    assert _rows(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_drop_last_gives_fixed_shapes(xp: client.Namespace) -> None:
    loader = nn.DataLoader(xp.asarray(X), xp.asarray(Y), batch_size=4, drop_last=True)
    assert len(loader) == 2
    batches = list(loader)
    assert [xb.shape for xb, _ in batches] == [(4, 3), (4, 3)]
    assert _rows(batches) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_is_reproducible_and_new_each_epoch(xp: client.Namespace) -> None:
    def epochs(seed: int) -> list[list[list[int]]]:
        loader = nn.DataLoader(xp.asarray(X), xp.asarray(Y), batch_size=3, shuffle=True, seed=seed)
        return [_rows(list(loader)) for _ in range(3)]

    first, again, other = epochs(0), epochs(0), epochs(1)
    assert first == again != other
    assert first[0] != first[1]  # a new order each pass
    for epoch in first:
        assert sorted(sum(epoch, [])) == list(range(10))  # every row once
        assert [len(b) for b in epoch] == [3, 3, 3, 1]
    rng = np.random.default_rng(0)
    expected = rng.permutation(10)  # the generator's order, batched
    assert sum(first[0], []) == expected.tolist()


def test_a_generator_of_ones_own(xp: client.Namespace) -> None:
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    loader = nn.DataLoader(xp.asarray(X), batch_size=5, shuffle=True, generator=rng)
    once = [np.asarray(b).tolist() for b in loader]  # one array: the batches themselves
    rng.bit_generator.state = state  # a checkpoint's state brings the same order back
    assert [np.asarray(b).tolist() for b in loader] == once


def test_nothing_is_downloaded(xp: client.Namespace, dev: client.RemoteDevice) -> None:
    calls: list[int] = []
    read = dev.submit_read

    def counted(tensor_id: int) -> Any:
        calls.append(tensor_id)
        return read(tensor_id)

    dev.submit_read = counted  # type: ignore[method-assign]
    loader = nn.DataLoader(xp.asarray(X), xp.asarray(Y), batch_size=4, shuffle=True, seed=0)
    batches = list(loader)
    assert calls == []
    assert len(batches) == 3


def test_over_tensors_and_numpy(xp: client.Namespace) -> None:
    ad = Autodiff(xp)
    loader = nn.DataLoader(ad.asarray(X), ad.asarray(Y), batch_size=6)
    assert _rows(list(loader)) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    local = nn.DataLoader(X, Y, batch_size=6, drop_last=True)
    assert _rows(list(local)) == [[0, 1, 2, 3, 4, 5]]


def test_refusals(xp: client.Namespace) -> None:
    with pytest.raises(ValueError, match="at least one array"):
        nn.DataLoader()
    with pytest.raises(ValueError, match="different lengths"):
        nn.DataLoader(xp.asarray(X), xp.asarray(Y[:5]))
    with pytest.raises(ValueError, match="0-d"):
        nn.DataLoader(xp.asarray(1.0))
    with pytest.raises(ValueError, match="batch_size"):
        nn.DataLoader(xp.asarray(X), batch_size=0)
    with pytest.raises(ValueError, match="seed or generator"):
        nn.DataLoader(xp.asarray(X), seed=1, generator=np.random.default_rng())
