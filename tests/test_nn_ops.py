"""The neural-network extension's ops on their own, through a real server and the real client:
convolutions (forward, transpose, weight gradient), pooling and its gradient against naive loop
references written from the definitions (``tests/nn_reference.py``; float64; groups,
dilation, stride, asymmetric padding, the transpose's output padding), each bit for bit the
same on the server, on an ``ndarray`` device and on numpy in the client (they run the same
executor code); typed refusals of shapes and dtypes that do not fit, from the client's own
check and from the server for an op sent without it; random draws equal on all three; a
captured graph of the ops replayed on new values. The executor's batch chunks and its count
of scratch memory: tests/test_nn_scratch.py; convolution bombs: tests/test_limits_nn.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import client
from client.autodiff.extension import extension_of
from client.capture import Capture
from client.device import new_handle
from client.extension import _Ops
from protocol import ErrorCode, OpDTypeError, OpShapeError, TensorMeta

from .nn_reference import conv_nd, conv_transpose_nd, conv_weight_grad_nd, pool_nd
from .test_autodiff_nn import PROPERTIES, convolutions, poolings

Array = np.ndarray[Any, Any]
TOL = {"rtol": 1e-12, "atol": 1e-12}  # the references add in another order


# --- the same numbers on a server, an ndarray device and numpy ----------------------------------


@pytest.fixture(scope="module")
def local_device() -> Iterator[client.Device]:
    with client.open_device("ndarray") as device:
        yield device


@pytest.fixture
def everywhere(xp: client.Namespace, local_device: client.Device) -> dict[str, Any]:
    """The namespaces the ops run on: a server's, an ndarray device's, numpy."""
    return {"server": xp, "ndarray": client.namespace(local_device), "numpy": np}


def _numpy(array: Any) -> Array:
    return array if isinstance(array, np.ndarray) else array.numpy()


def _same_everywhere(namespaces: dict[str, Any], f: Callable[..., Any], *arrays: Array) -> Array:
    """``f(extension, *arrays)`` on every namespace, the results equal bit for bit."""
    results = {
        name: _numpy(f(extension_of(xp), *(xp.asarray(a) for a in arrays)))
        for name, xp in namespaces.items()
    }
    for name, result in results.items():
        np.testing.assert_array_equal(result, results["numpy"], err_msg=name)
        assert result.dtype == results["numpy"].dtype, name
    return results["server"]


@PROPERTIES
@given(p=convolutions(), data=st.data())
def test_convolutions_match_the_loops_everywhere(
    everywhere: dict[str, Any], p: dict[str, Any], data: st.DataObject
) -> None:
    """The forward convolution, its weight gradient and its transpose (with a drawn output
    padding below the stride or dilation, PyTorch's rule); and the transpose back to x's
    shape is the convolution's adjoint: <conv(x), g> = <x, conv_transpose(g)>."""
    s, kernel = p["spatial"], p["w"][2:]
    loops = (s["stride"], s["padding"], s["dilation"], s["groups"])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x, w = rng.standard_normal(p["x"]), rng.standard_normal(p["w"])
    y = _same_everywhere(everywhere, lambda ext, a, b: ext.conv(a, b, **s), x, w)
    np.testing.assert_allclose(y, conv_nd(x, w, *loops), **TOL)
    grad = rng.standard_normal(y.shape)
    gw = _same_everywhere(
        everywhere, lambda ext, a, g: ext.conv_weight_grad(a, g, kernel=kernel, **s), x, grad
    )
    np.testing.assert_allclose(gw, conv_weight_grad_nd(x, grad, kernel, *loops), **TOL)
    spans = [
        (m - 1) * st_ + d * (k - 1) + 1
        for m, st_, d, k in zip(y.shape[2:], s["stride"], s["dilation"], kernel, strict=True)
    ]
    back = tuple(
        m + lo + hi - f for m, (lo, hi), f in zip(x.shape[2:], s["padding"], spans, strict=True)
    )
    extra = tuple(
        data.draw(st.integers(0, max(a, b) - 1))
        for a, b in zip(s["stride"], s["dilation"], strict=True)
    )
    for output_padding in (back, extra):
        lengths = [
            f - lo - hi + e
            for f, (lo, hi), e in zip(spans, s["padding"], output_padding, strict=True)
        ]
        if min(lengths) < 1:
            continue
        gx = _same_everywhere(
            everywhere,
            lambda ext, g, b, out_pad=output_padding: ext.conv_transpose(
                g, b, **s, output_padding=out_pad
            ),
            grad,
            w,
        )
        np.testing.assert_allclose(gx, conv_transpose_nd(grad, w, *loops, output_padding), **TOL)
    np.testing.assert_allclose(
        np.vdot(y, grad), np.vdot(x, conv_transpose_nd(grad, w, *loops, back)), **TOL
    )


@PROPERTIES
@given(
    p=poolings(),
    kind=st.sampled_from(["max", "avg", "avg_exclude_pad"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_pooling_and_its_gradient_match_the_loops_everywhere(
    everywhere: dict[str, Any], p: dict[str, Any], kind: str, seed: int
) -> None:
    op, include = ("max", True) if kind == "max" else ("avg", kind == "avg")
    window = {k: p[k] for k in ("kernel", "stride", "padding")}
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(p["shape"])
    y = _same_everywhere(
        everywhere, lambda ext, a: ext.pool(op, a, **window, count_include_pad=include), x
    )
    grad = rng.standard_normal(y.shape)
    gx = _same_everywhere(
        everywhere,
        lambda ext, a, g: ext.pool_backward(op, a, g, **window, count_include_pad=include),
        x,
        grad,
    )
    want_y, want_gx = pool_nd(op, x, grad, *window.values(), include)
    np.testing.assert_allclose(y, want_y, **TOL)
    np.testing.assert_allclose(gx, want_gx, **TOL)


@pytest.mark.parametrize("grad_infinite", [False, True], ids=["finite", "an infinite gradient"])
def test_max_pooling_gives_a_window_s_gradient_to_its_first_largest_or_nan(
    everywhere: dict[str, Any], grad_infinite: bool
) -> None:
    """Ties (integers), -inf, a NaN, overlapping windows and padding: each window's gradient
    goes to its first largest element, its first NaN in a window that holds one, as argmax
    would; an infinite gradient reaches only that element (its product by 0 would be NaN)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 3, (2, 2, 5, 6)).astype(np.float64)
    x[0, 0, 1, 2], x[1, 1, 4, 0], x[1, 0, 2, :] = np.nan, -np.inf, -np.inf
    window = {"kernel": (3, 3), "stride": (2, 1), "padding": (1, 1)}
    y = _same_everywhere(everywhere, lambda ext, a: ext.pool("max", a, **window), x)
    grad = rng.integers(-3, 4, y.shape).astype(np.float64)  # integers: sums in any order
    if grad_infinite:
        grad[1, 0, 1, 3] = np.inf
    gx = _same_everywhere(
        everywhere, lambda ext, a, g: ext.pool_backward("max", a, g, **window), x, grad
    )
    want_y, want_gx = pool_nd("max", x, grad, *window.values(), True)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(gx, want_gx)
    assert np.isnan(y[0, 0]).any() and (np.isinf(gx).sum() == 1) == grad_infinite


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("draw", ["uniform", "normal"])
def test_random_draws_are_philox_at_the_state_everywhere(
    everywhere: dict[str, Any], draw: str, dtype: str
) -> None:
    """One state gives the same numbers everywhere: numpy's Philox keyed by [seed, offset],
    which the op reads and leaves as it was."""
    state = np.array([28, 5], dtype=np.uint64)
    drawn = _same_everywhere(
        everywhere, lambda ext, s: ext.random(s, op=draw, shape=(3, 4), dtype=dtype), state
    )
    philox = np.random.Generator(np.random.Philox(key=state))
    want = (
        philox.random((3, 4), dtype=dtype)
        if draw == "uniform"
        else philox.standard_normal((3, 4), dtype=dtype)
    )
    np.testing.assert_array_equal(drawn, want)
    assert drawn.dtype == dtype
    remote_state = everywhere["server"].asarray(state)
    extension_of(everywhere["server"]).random(remote_state, op=draw, shape=(2,), dtype=dtype)
    assert remote_state.numpy().tolist() == [28, 5]


# --- refusals ----------------------------------------------------------------------------------


class _Made(_Ops):
    """The extension's functions, each giving the op it would run (as ``make(out, ids)``)
    instead of running it."""

    def _run(self, make: Any, *arrays: Any) -> Any:
        return make


GRADIENT_2X2 = np.zeros((1, 1, 2, 2))
REFUSED: dict[str, tuple[type[Exception], Callable[..., Any], tuple[Array, ...]]] = {
    "integer input": (
        OpDTypeError,
        lambda ext, x, w: ext.conv(
            x, w, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=1
        ),
        (np.zeros((1, 1, 4, 4), np.int64), np.zeros((1, 1, 3, 3))),
    ),
    "two float dtypes": (
        OpDTypeError,
        lambda ext, x, w: ext.conv(
            x, w, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=1
        ),
        (np.zeros((1, 1, 4, 4), np.float32), np.zeros((1, 1, 3, 3))),
    ),
    "channels not in groups": (
        OpShapeError,
        lambda ext, x, w: ext.conv(
            x, w, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=2
        ),
        (np.zeros((1, 3, 4, 4)), np.zeros((2, 1, 3, 3))),
    ),
    "kernel over the padded input": (
        OpShapeError,
        lambda ext, x, w: ext.conv(
            x, w, stride=(1, 1), padding=((0, 0), (1, 0)), dilation=(1, 1), groups=1
        ),
        (np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 3, 3))),
    ),
    "spatial dimensions": (
        OpShapeError,
        lambda ext, x, w: ext.conv(
            x, w, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=1
        ),
        (np.zeros((1, 1, 4)), np.zeros((1, 1, 3))),
    ),
    "transpose weight": (
        OpShapeError,
        lambda ext, x, w: ext.conv_transpose(
            x,
            w,
            stride=(1, 1),
            padding=((0, 0),) * 2,
            dilation=(1, 1),
            groups=1,
            output_padding=(0, 0),
        ),
        (np.zeros((1, 2, 3, 3)), np.zeros((3, 1, 2, 2))),
    ),
    "weight gradient's output gradient": (
        OpShapeError,
        lambda ext, x, g: ext.conv_weight_grad(
            x, g, kernel=(3, 3), stride=(1, 1), padding=((1, 1),) * 2, dilation=(1, 1), groups=1
        ),
        (np.zeros((1, 1, 4, 4)), GRADIENT_2X2),
    ),
    "pool padding over half the kernel": (
        OpShapeError,
        lambda ext, x: ext.pool("max", x, kernel=(2, 2), stride=(1, 1), padding=(2, 0)),
        (np.zeros((1, 1, 4, 4)),),
    ),
    "pool gradient's shape": (
        OpShapeError,
        lambda ext, x, g: ext.pool_backward(
            "avg", x, g, kernel=(3, 3), stride=(1, 1), padding=(0, 0)
        ),
        (np.zeros((1, 1, 5, 5)), GRADIENT_2X2),
    ),
    "integer pooling": (
        OpDTypeError,
        lambda ext, x: ext.pool("avg", x, kernel=(2, 2), stride=(2, 2), padding=(0, 0)),
        (np.zeros((1, 1, 4, 4), np.int32),),
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_ops_that_do_not_fit_are_refused_by_the_client_and_the_server(
    dev: client.RemoteDevice, xp: client.Namespace, name: str
) -> None:
    """The client's check raises the typed error before anything is sent; the same op sent
    without it is refused by the server (``invalid_op``, naming the reason) and the session
    goes on."""
    error, call, arrays = REFUSED[name]
    remote = [xp.asarray(a) for a in arrays]
    with pytest.raises(error) as local:
        call(extension_of(xp), *remote)
    out = dev.new_id()
    dev.submit(call(_Made(), *remote)(out, [a.tensor_id for a in remote]))
    with pytest.raises(client.RemoteError) as refused:
        new_handle(dev, out, TensorMeta((1,), "float64")).numpy()
    assert refused.value.code == ErrorCode.INVALID_OP
    assert str(local.value) in str(refused.value)
    np.testing.assert_array_equal(xp.ones(3).numpy(), np.ones(3))


# --- a captured graph --------------------------------------------------------------------------

SPATIAL = {"stride": (2, 1), "padding": ((1, 0), (0, 2)), "dilation": (1, 2), "groups": 2}
WINDOW = {"kernel": (2, 3), "stride": (2, 1), "padding": (1, 1)}


def _step(ext: Any, x: Any, w: Any, grad: Any) -> dict[str, Any]:
    """Every convolution and pooling op, forward and backward, on one input."""
    pooled = ext.pool("max", x, **WINDOW)
    return {
        "y": ext.conv(x, w, **SPATIAL),
        "gw": ext.conv_weight_grad(x, grad, kernel=(3, 2), **SPATIAL),
        "gx": ext.conv_transpose(grad, w, **SPATIAL, output_padding=(1, 0)),
        "max_grad": ext.pool_backward("max", x, pooled, **WINDOW),
        "avg": ext.pool("avg", x, **WINDOW, count_include_pad=False),
        "avg_grad": ext.pool_backward("avg", x, pooled, **WINDOW, count_include_pad=False),
    }


def _step_inputs(seed: int) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((2, 4, 6, 5)),
        "w": rng.standard_normal((6, 2, 3, 2)),
        "grad": rng.standard_normal((2, 6, 3, 5)),
    }


def test_a_captured_graph_of_the_ops_replays_on_new_values(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    ext = extension_of(xp)
    uploaded = {name: xp.asarray(a) for name, a in _step_inputs(0).items()}
    with Capture(dev) as cap:
        inputs = {name: cap.input(name, a) for name, a in uploaded.items()}
        for name, result in _step(ext, **inputs).items():
            cap.output(name, result)
    second = _step_inputs(1)
    replayed = cap.graph.replay(dev, second)
    by_id = cap.graph.register(dev).run(second)
    local = _step(extension_of(np), **second)
    loops = (SPATIAL["stride"], SPATIAL["padding"], SPATIAL["dilation"], SPATIAL["groups"])
    for name, want in local.items():
        np.testing.assert_array_equal(replayed[name].numpy(), want, err_msg=name)
        np.testing.assert_array_equal(by_id[name].numpy(), want, err_msg=name)
    x, w, grad = second["x"], second["w"], second["grad"]
    np.testing.assert_allclose(local["y"], conv_nd(x, w, *loops), **TOL)
    np.testing.assert_allclose(local["gw"], conv_weight_grad_nd(x, grad, (3, 2), *loops), **TOL)
    np.testing.assert_allclose(local["gx"], conv_transpose_nd(grad, w, *loops, (1, 0)), **TOL)
    pooled = pool_nd("max", x, None, *WINDOW.values(), True)[0]
    np.testing.assert_allclose(
        local["max_grad"], pool_nd("max", x, pooled, *WINDOW.values(), True)[1], **TOL
    )
    avg, avg_grad = pool_nd("avg", x, pooled, *WINDOW.values(), False)
    np.testing.assert_allclose(local["avg"], avg, **TOL)
    np.testing.assert_allclose(local["avg_grad"], avg_grad, **TOL)
