"""Gradients of the neural-network extension's differentiable functions (convolutions, their
transpose, poolings) against central finite differences in float64, as property tests over
shapes, strides, paddings, dilations and groups, through a real server: each drawn case is
checked by ``test_autodiff_gradients``'s own machinery (the autodiff gradient of
``sum(f(x) * w)`` for a random ``w`` equals the finite differences within 1e-6, and equals
numpy's bit for bit)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import client
from client.autodiff import Autodiff, Tensor

from .test_autodiff_gradients import ANY, GRID, NN, _check_remote_against_numpy, case

PROPERTIES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
MOST_ELEMENTS = 160  # per input: each costs two evaluations of the function


@st.composite
def convolutions(draw: st.DrawFn) -> dict[str, Any]:
    """A convolution's parameters and shapes that fit together: 1 or 2 spatial dimensions."""
    dims = draw(st.integers(1, 2))
    groups = draw(st.integers(1, 3))
    c_in, c_out = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(dims))
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(dims))
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]
    lengths = tuple(
        draw(st.integers(max(1, span - lo - hi), span + 4))
        for span, (lo, hi) in zip(spans, padding, strict=True)
    )
    return {
        "x": (draw(st.integers(1, 2)), c_in, *lengths),
        "w": (c_out, c_in // groups, *kernel),
        "spatial": {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups},
    }


@PROPERTIES
@given(p=convolutions(), bias=st.booleans())
def test_conv_gradients(xp: client.Namespace, p: dict[str, Any], bias: bool) -> None:
    assume(math.prod(p["x"]) <= MOST_ELEMENTS)
    specs = [ANY(*p["x"]), ANY(*p["w"])] + ([ANY(p["w"][0])] if bias else [])

    def f(ad: Autodiff, x: Tensor, w: Tensor, *b: Tensor) -> Tensor:
        return ad.conv(x, w, *b, **p["spatial"])

    _check_remote_against_numpy(xp, case(f"conv{p}", f, *specs, namespaces=NN))


@PROPERTIES
@given(p=convolutions(), data=st.data())
def test_conv_transpose_gradients(xp: client.Namespace, p: dict[str, Any], data: Any) -> None:
    """The transposed convolution of the drawn convolution's output shape, with an output
    padding below its stride or dilation (PyTorch's rule)."""
    spatial = p["spatial"]
    c_out, per_group, *kernel = p["w"]
    n, c_in, *lengths = p["x"]
    x_shape = (n, c_out, *(min(m, 3) for m in lengths))
    weight = (c_out, c_in // spatial["groups"], *kernel)
    extra = tuple(
        data.draw(st.integers(0, max(s, d) - 1))
        for s, d in zip(spatial["stride"], spatial["dilation"], strict=True)
    )
    out = [
        (m - 1) * s + d * (k - 1) + 1 - lo - hi + e
        for m, s, d, k, (lo, hi), e in zip(
            x_shape[2:],
            spatial["stride"],
            spatial["dilation"],
            kernel,
            spatial["padding"],
            extra,
            strict=True,
        )
    ]
    assume(min(out) >= 1 and math.prod(x_shape) <= MOST_ELEMENTS)

    def f(ad: Autodiff, x: Tensor, w: Tensor) -> Tensor:
        return ad.conv_transpose(x, w, **spatial, output_padding=extra)

    _check_remote_against_numpy(
        xp, case(f"conv_t{p}{extra}", f, ANY(*x_shape), ANY(*weight), namespaces=NN)
    )


@st.composite
def poolings(draw: st.DrawFn) -> dict[str, Any]:
    dims = draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    return {
        "shape": (
            draw(st.integers(1, 2)),
            draw(st.integers(1, 3)),
            *(draw(st.integers(k, k + 4)) for k in kernel),
        ),
        "kernel": kernel,
        "stride": tuple(draw(st.integers(1, 3)) for _ in range(dims)),
        "padding": tuple(draw(st.integers(0, k // 2)) for k in kernel),
    }


@PROPERTIES
@given(p=poolings(), op=st.sampled_from(["max", "avg", "avg_exclude_pad"]))
def test_pool_gradients(xp: client.Namespace, p: dict[str, Any], op: str) -> None:
    assume(math.prod(p["shape"]) <= MOST_ELEMENTS)
    window = {k: p[k] for k in ("kernel", "stride", "padding")}

    def f(ad: Autodiff, x: Tensor) -> Tensor:
        if op == "max":
            return ad.max_pool(x, **window)
        return ad.avg_pool(x, **window, count_include_pad=op == "avg")

    spec = GRID if op == "max" else ANY  # distinct values: no ties decide a maximum
    _check_remote_against_numpy(xp, case(f"{op}{p}", f, spec(*p["shape"]), namespaces=NN))


def test_array_api_strict_has_no_extension() -> None:
    """The extension is Tensorwire's own: a namespace without it says so, naming both."""
    import array_api_strict

    ad = Autodiff(array_api_strict)
    x = ad.asarray(array_api_strict.zeros((1, 1, 3)))
    with pytest.raises(TypeError, match="Tensorwire's own extension"):
        ad.max_pool(x, kernel=(2,), stride=(2,), padding=(0,))
