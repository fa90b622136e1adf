"""What a training step sends, through a real server: no gradient spends an op on a reshape, a
broadcast or a permutation that would leave its array as it is (each is a message and the
client's building of it), and the gradients that skip them, or normalize negative gather
positions with one remainder, are the same bits as the full sequence of ops they replace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import client
from client import nn, optim
from client.autodiff import Autodiff, Tensor

Array = np.ndarray[Any, Any]


class _Recording:
    """A namespace that passes every call to ``xp`` and keeps the shape ops that returned
    their array's shape unchanged (a permutation: its axes in order), by name."""

    def __init__(self, xp: Any) -> None:
        self._xp = xp
        self.unchanged: list[str] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._xp, name)
        if name not in ("reshape", "broadcast_to", "permute_dims"):
            return target

        def call(a: Any, shape: Any, /, **kwargs: Any) -> Any:
            out = target(a, shape, **kwargs)
            if name == "permute_dims":
                same = tuple(shape) == tuple(range(len(shape)))
            else:
                same = tuple(out.shape) == tuple(a.shape)
            if same:
                self.unchanged.append(name)
            return out

        return call


def _mlp_step(ad: Autodiff, rng: np.random.Generator) -> Callable[[], Tensor]:
    """The digits MLP's step (bench/training.py): gather, Linear/ReLU, cross-entropy, Adam."""
    x = ad.asarray(rng.standard_normal((64, 16), dtype=np.float32))
    y = ad.asarray(rng.integers(0, 10, 64))
    model = nn.Sequential(
        nn.Linear(16, 32, ad=ad, rng=rng), nn.ReLU(), nn.Linear(32, 10, ad=ad, rng=rng)
    )
    opt = optim.Adam(model.parameters(), lr=1e-3)

    def step() -> Tensor:
        index = ad.asarray(rng.integers(0, 64, 16))
        loss = nn.cross_entropy(model(ad.take(x, index, axis=0)), ad.take(y, index, axis=0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def _sequence_step(ad: Autodiff, rng: np.random.Generator) -> Callable[[], Tensor]:
    """A transformer's parts: token and position embeddings, layer norm (means kept by
    keepdims), self-attention, a Linear over (batch, length, width), AdamW."""
    length, width, alphabet = 6, 8, 11
    token = nn.Embedding(alphabet, width, ad=ad, rng=rng)
    position = nn.Embedding(length, width, ad=ad, rng=rng)
    norm = nn.LayerNorm(width, ad=ad)
    attention = nn.MultiheadAttention(width, 2, batch_first=True, ad=ad, rng=rng)
    head = nn.Linear(width, alphabet, ad=ad, rng=rng)
    params = [p for m in (token, position, norm, attention, head) for p in m.parameters()]
    opt = optim.AdamW(params, lr=1e-3)

    def step() -> Tensor:
        codes = ad.asarray(rng.integers(0, alphabet, (3, length + 1)))
        h = token(codes[:, :-1]) + position(ad.arange(length))
        h = norm(h)
        attended, _ = attention(h, h, h, need_weights=False)
        logits = head(h + attended)
        loss = nn.cross_entropy(ad.reshape(logits, (-1, alphabet)), ad.reshape(codes[:, 1:], (-1,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


@pytest.mark.parametrize("make", [_mlp_step, _sequence_step], ids=["mlp", "sequence"])
def test_a_training_step_sends_no_shape_op_that_changes_nothing(
    xp: client.Namespace, make: Callable[[Autodiff, np.random.Generator], Any]
) -> None:
    recording = _Recording(xp)
    step = make(Autodiff(recording), np.random.default_rng(0))
    losses = [float(step()) for _ in range(3)]
    assert all(np.isfinite(losses))  # the server ran the steps
    assert recording.unchanged == []


# --- the same bits as the full sequences of ops -----------------------------------------------


def _bits(array: Any) -> tuple[str, bytes]:
    values = np.asarray(array)
    return str(values.dtype), values.tobytes()


def _one_hot_by_where(xp: Any, positions: Any, n: int, dtype: Any) -> Any:
    positions = xp.where(positions < 0, positions + n, positions)
    hits = xp.expand_dims(positions, axis=-1) == xp.arange(n, dtype=positions.dtype)
    return xp.astype(hits, dtype)


def _take_along_last(xp: Any, x: Any, ia: Any, g: Any) -> Any:
    """take_along_axis's gradient along the last axis as every op of it, the permutations
    that move nothing and the broadcast to the same shape included."""
    rows = xp.expand_dims(xp.permute_dims(g, (0, 1)), axis=-2)
    spread = xp.permute_dims(xp.broadcast_to(ia, tuple(g.shape)), (0, 1))
    hot = _one_hot_by_where(xp, spread, x.shape[-1], g.dtype)
    return xp.permute_dims(xp.squeeze(rows @ hot, axis=-2), (0, 1))


def _take_first(xp: Any, x: Any, ia: Any, g: Any) -> Any:
    """take's gradient along axis 0 of a matrix, as every op of it."""
    summed = xp.permute_dims(g, (1, 0)) @ _one_hot_by_where(xp, ia, x.shape[0], g.dtype)
    return xp.permute_dims(summed, (1, 0))


def _take_vector(xp: Any, x: Any, ia: Any, g: Any) -> Any:
    """take's gradient from a vector, as every op of it."""
    summed = xp.permute_dims(g, (0,)) @ _one_hot_by_where(xp, ia, x.shape[0], g.dtype)
    return xp.permute_dims(summed, (0,))


GATHERS = {
    "take_along_axis": (lambda ad, x, i: ad.take_along_axis(x, i, axis=-1), _take_along_last),
    "take, axis 0": (lambda ad, x, i: ad.take(x, i, axis=0), _take_first),
    "take, a vector": (lambda ad, x, i: ad.take(x, i), _take_vector),
}


@pytest.mark.parametrize("name", list(GATHERS))
@pytest.mark.parametrize("where", ["numpy", "server"])
def test_a_gather_gradient_is_the_bits_of_its_every_op_sequence(
    dev: client.RemoteDevice, name: str, where: str
) -> None:
    """Negative positions (numbered from the end) and positions taken twice, in float32."""
    xp = np if where == "numpy" else client.namespace(dev)
    ad = Autodiff(xp)
    rng = np.random.default_rng(1)
    shape, positions = (
        ((5, 7), [[-1], [0], [-7], [3], [-1]])
        if name == "take_along_axis"
        else ((5,), [-1, 4, 0, -5, 2, 2])
        if name == "take, a vector"
        else ((5, 3), [-1, 4, 0, -5, 2, 2])
    )
    forward, reference = GATHERS[name]
    x = ad.asarray(rng.standard_normal(shape, dtype=np.float32), requires_grad=True)
    ia = xp.asarray(np.array(positions))
    y = forward(ad, x, ia)
    g = xp.asarray(rng.standard_normal(tuple(y.shape), dtype=np.float32))
    y.backward(g)
    assert x.grad is not None
    assert _bits(x.grad.array) == _bits(reference(xp, x.array, ia, g))


@pytest.mark.parametrize("where", ["numpy", "server"])
def test_linear_matmul_and_mean_gradients_are_the_bits_of_their_every_op_sequence(
    dev: client.RemoteDevice, where: str
) -> None:
    """Linear of a matrix, matmul of matrices and a mean kept by keepdims: the reshapes to the
    shape they have already, which the gradients no longer send, change no bit."""
    xp = np if where == "numpy" else client.namespace(dev)
    ad = Autodiff(xp)
    rng = np.random.default_rng(2)

    def leaf(*shape: int) -> Tensor:
        return ad.asarray(rng.standard_normal(shape, dtype=np.float32), requires_grad=True)

    def upstream(y: Tensor) -> Any:
        return xp.asarray(rng.standard_normal(tuple(y.shape), dtype=np.float32))

    x, w, b = leaf(6, 4), leaf(3, 4), leaf(3)
    y = ad.linear(x, w, b)
    g = upstream(y)
    y.backward(g)
    rows = xp.reshape(g, (-1, 3))
    expected_w = xp.matrix_transpose(rows) @ xp.reshape(x.array, (-1, 4))
    assert w.grad is not None and b.grad is not None and x.grad is not None
    assert _bits(w.grad.array) == _bits(expected_w)
    assert _bits(b.grad.array) == _bits(xp.sum(rows, axis=0))
    assert _bits(x.grad.array) == _bits(g @ w.array)

    p, q = leaf(4, 5), leaf(5, 2)
    y = p @ q
    g = upstream(y)
    y.backward(g)
    assert p.grad is not None and q.grad is not None
    assert _bits(p.grad.array) == _bits(xp.reshape(g @ xp.matrix_transpose(q.array), (4, 5)))
    assert _bits(q.grad.array) == _bits(xp.reshape(xp.matrix_transpose(p.array) @ g, (5, 2)))

    m = leaf(4, 6)
    y = ad.mean(m, axis=1, keepdims=True)
    g = upstream(y)
    y.backward(g)
    assert m.grad is not None
    assert _bits(m.grad.array) == _bits(xp.broadcast_to(xp.reshape(g, (4, 1)) / 6, (4, 6)))
