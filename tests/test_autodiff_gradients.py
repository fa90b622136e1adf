"""Every gradient of ``client.autodiff`` against central finite differences, in float64.

Each case is a function of one or more float64 inputs. Its autodiff gradient is the gradient
of ``sum(f(inputs) * w)`` for a fixed random ``w`` of the output's shape, so that a non-scalar
output is checked with a general output gradient, not only with ones. The finite differences
differentiate the same function evaluated by the same namespace. The table runs three ways:

* through a real server (``Autodiff(client.namespace(dev))``), finite differences included,
  each perturbed evaluation uploading its inputs and running ``f`` remotely; there the gradients
  must also equal, bit for bit, those of ``Autodiff(numpy)``: the server runs the same numpy
  calls on the same values, so any difference would be a gradient that went another way;
* on numpy, and on ``array_api_strict``, which holds the autodiff to the standard alone.

Inputs keep away from kinks and ties (positive logs, bases and divisors; distinct values where
a maximum, minimum or clip bound decides; quotients away from integers for ``//`` and ``%``), so
a finite difference of step 1e-6 sees a smooth function. A case that crossed one would fail
loudly (a difference of order 1/eps), not pass quietly.

Every name in ``DIFFERENTIABLE`` is checked: the cases' graphs are walked for the ops they
recorded, and those must be all of ``DIFFERENTIABLE``. Broadcasting and reductions also get
property tests (hypothesis) through the server.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import array_api_strict
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import client
from client.autodiff import DIFFERENTIABLE, Autodiff, Tensor

Array = np.ndarray[Any, Any]
EPS = 1e-6  # the central difference's step
TOL = 1e-6  # relative and absolute; the differences themselves are good to about 1e-9 here

# --- inputs: each kept where its case's function is smooth ----------------------------------


@dataclass(frozen=True)
class Spec:
    """How to draw one input: ``kind`` says from where, ``shape`` its shape."""

    kind: str
    shape: tuple[int, ...]
    offset: float = 0.0  # for "grid": where the grid sits

    def make(self, rng: np.random.Generator) -> Array:
        n = math.prod(self.shape)
        sign = rng.choice([-1.0, 1.0], n)
        if self.kind == "any":  # either sign, away from 0 (abs, sign, relu, reciprocal)
            flat = sign * rng.uniform(0.2, 2.0, n)
        elif self.kind == "small":  # away from 0 and from tan's poles
            flat = sign * rng.uniform(0.1, 1.0, n)
        elif self.kind == "positive":  # logs, square roots, bases of pow, divisors
            flat = rng.uniform(0.5, 2.0, n)
        elif self.kind == "grid":  # distinct, 0.25 apart: no ties; grids of two offsets meet
            flat = (rng.permutation(n) - n // 2) * 0.25 + self.offset  # nowhere
        elif self.kind == "fractional":  # 0.15 or more from an integer and from a half
            flat = rng.integers(-3, 3, n) + rng.choice([0.2, 0.3, 0.7, 0.8], n)
            flat = flat + rng.uniform(-0.05, 0.05, n)
        elif self.kind == "near_one":  # divisors: fractional / near_one stays fractional
            flat = rng.uniform(0.98, 1.02, n)
        elif self.kind == "huge":  # +-1000: exp would overflow without the shift
            flat = sign * 1000.0 + rng.uniform(-3.0, 3.0, n)
        else:
            raise AssertionError(self.kind)
        return np.asarray(flat, dtype=np.float64).reshape(self.shape)


def _spec(kind: str, offset: float = 0.0) -> Callable[..., Spec]:
    return lambda *shape: Spec(kind, shape, offset)


ANY, SMALL, POS, FRAC, NEAR_ONE, HUGE = map(
    _spec, ["any", "small", "positive", "fractional", "near_one", "huge"]
)
GRID, BETWEEN = _spec("grid"), _spec("grid", 0.125)
# clip's bounds, every lower one below every upper one (min > max is implementation defined;
# array_api_strict refuses it), each on a grid that meets GRID's nowhere
LOWER, UPPER = _spec("grid", -0.375), _spec("grid", 0.5625)

# --- the cases ---------------------------------------------------------------------------------

NAMESPACES = ("remote", "numpy", "array_api_strict")


@dataclass(frozen=True)
class Case:
    id: str
    f: Callable[..., Tensor]  # f(ad, *inputs): the autodiff namespace and one tensor per spec
    specs: tuple[Spec, ...]
    namespaces: tuple[str, ...] = NAMESPACES  # each exclusion is justified where it is made
    eps: float = EPS
    tol: float = TOL


def case(id: str, f: Callable[..., Tensor], *specs: Spec, **options: Any) -> Case:
    return Case(id, f, specs, **options)


# array_api_strict refuses, as the standard leaves them unspecified: an index that names fewer
# axes than the array has without a trailing ``...`` (numpy's flat ``x[1]`` on 2-D), an
# integer-array index combined with anything but integers (``x[i]`` on 2-D), and lists as
# indices. Each such key has a twin that runs there too (``x[1, ...]``, ``x[i, j]``, ``x[i, 1]``).
NOT_STRICT = ("remote", "numpy")
# ``plain @ tensor`` reaches Tensor.__rmatmul__ only when the plain array's __matmul__ returns
# NotImplemented for a Tensor: numpy's and RemoteArray's do, array_api_strict's raises
# TypeError ("Expected Array or Python scalar").
PLAIN_LEFT = ("remote", "numpy")
# The neural-network extension is Tensorwire's own (client.autodiff.extension): a Tensorwire
# namespace and numpy have it, array_api_strict does not.
NN = ("remote", "numpy")


def _plain(ad: Autodiff, *shape: int) -> Any:
    """An array of the wrapped namespace itself (not a tensor), as a constant operand."""
    return ad.xp.asarray(np.arange(1.0, math.prod(shape) + 1).reshape(shape))


def _shared(ad: Autodiff, h: Tensor) -> Tensor:
    return h * h + ad.exp(h)[::-1, ...] * ad.sum(h, axis=0)


def _index(ad: Autodiff, values: Any) -> Tensor:
    return ad.asarray(np.asarray(values, dtype=np.int64))


def _call(name: str, **kwargs: Any) -> Callable[..., Tensor]:
    return lambda ad, *xs: getattr(ad, name)(*xs, **kwargs)


UNARY = [
    ("exp", ANY),
    ("expm1", ANY),
    ("log", POS),
    ("log1p", POS),
    ("log2", POS),
    ("log10", POS),
    ("sqrt", POS),
    ("square", ANY),
    ("tanh", ANY),
    ("sinh", ANY),
    ("cosh", ANY),
    ("sin", ANY),
    ("cos", ANY),
    ("tan", SMALL),
    ("atan", ANY),
    ("abs", ANY),
    ("negative", ANY),
    ("positive", ANY),
    ("reciprocal", ANY),
    ("floor", FRAC),
    ("ceil", FRAC),
    ("round", FRAC),
    ("trunc", FRAC),
    ("sign", ANY),
    ("sigmoid", ANY),
    ("relu", ANY),
]

# Binary functions, each with inputs of three pairs of shapes that broadcast differently.
BINARY = [
    ("add", ANY, ANY),
    ("subtract", ANY, ANY),
    ("multiply", ANY, ANY),
    ("divide", ANY, POS),
    ("pow", POS, ANY),
    ("maximum", GRID, BETWEEN),
    ("minimum", GRID, BETWEEN),
    ("floor_divide", FRAC, NEAR_ONE),
    ("remainder", FRAC, NEAR_ONE),
    ("logaddexp", ANY, ANY),
    ("atan2", ANY, ANY),
    ("hypot", ANY, ANY),
]
BROADCAST_SHAPES = [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 2), (3, 1))]

CASES: list[Case] = [
    *(case(name, _call(name), spec(3, 4)) for name, spec in UNARY),
    case("sigmoid_huge", _call("sigmoid"), HUGE(6)),
    *(
        case(f"{name}{a}{b}", _call(name), left(*a), right(*b))
        for name, left, right in BINARY
        for a, b in BROADCAST_SHAPES
    ),
    # operators, and Python scalars on either side
    case("op_add", lambda ad, a, b: a + b, ANY(3, 4), ANY(4)),
    case("op_sub", lambda ad, a, b: a - b, ANY(3, 1), ANY(1, 4)),
    case("op_mul", lambda ad, a, b: a * b, ANY(2, 3, 2), ANY(3, 1)),
    case("op_div", lambda ad, a, b: a / b, ANY(3, 4), POS(4)),
    case("op_floordiv", lambda ad, a, b: a // b, FRAC(3, 4), NEAR_ONE(4)),
    case("op_mod", lambda ad, a, b: a % b, FRAC(3, 4), NEAR_ONE(3, 1)),
    case("op_pow", lambda ad, a, b: a**b, POS(3, 4), ANY(4)),
    case("op_matmul", lambda ad, a, b: a @ b, ANY(3, 4), ANY(4, 2)),
    case("op_neg_pos_abs", lambda ad, x: abs(-x) * +x, ANY(3, 4)),
    case("scalar_right", lambda ad, x: (x + 2.5) * (x - 1.5) * (x * -3.0) / 0.7, ANY(3, 4)),
    case("scalar_left", lambda ad, x: (2.5 + x) * (1.5 - x) * (-3 * x) + 0.7 / x, ANY(3, 4)),
    case("scalar_floordiv_mod", lambda ad, x: x // 1.0 + x % 1.0 + x % -1.0, FRAC(3, 4)),
    case("scalar_left_floordiv_mod", lambda ad, x: 5.3 // x + 5.3 % x, NEAR_ONE(3, 4)),
    case("scalar_pow", lambda ad, x: x**3 + x**0.5 + x**-1.5 + x**0 + x**2.0, POS(3, 4)),
    case("scalar_left_pow", lambda ad, x: 2.0**x + 0.5**x, ANY(3, 4)),
    case(
        "constants",
        lambda ad, x: (
            ad.asarray(np.ones((3, 3))) @ x + ad.tensor(ad.xp.asarray(np.arange(4.0))) * x
        ),
        ANY(3, 4),
    ),
    case(
        "plain_left",
        lambda ad, x: (
            _plain(ad, 2, 3) @ x
            + _plain(ad, 4) * x[:2, ...]
            - _plain(ad, 4) / (x[1:, ...] * x[1:, ...] + 1.0)
        ),
        ANY(3, 4),
        namespaces=PLAIN_LEFT,
    ),
    case("shared_input", lambda ad, x: x * x + ad.exp(x) * ad.sin(x), ANY(3, 4)),
    # an intermediate used three times: its gradients add up before flowing on
    case("shared_intermediate", lambda ad, x: _shared(ad, ad.tanh(x)), ANY(3, 4)),
    # reductions: axis None, int, negative, tuple; keepdims both ways
    case("sum_all", _call("sum"), ANY(3, 4)),
    case("sum_axis0_keep", _call("sum", axis=0, keepdims=True), ANY(3, 4)),
    case("sum_neg_tuple", _call("sum", axis=(0, -1)), ANY(2, 3, 2)),
    case("mean_all_keep", _call("mean", keepdims=True), ANY(3, 4)),
    case("mean_axis1", _call("mean", axis=-2), ANY(2, 3, 2)),
    case("max_all", _call("max"), GRID(3, 4)),
    case("max_axis1_keep", _call("max", axis=1, keepdims=True), GRID(3, 4)),
    case("max_tuple", _call("max", axis=(0, 2)), GRID(2, 3, 2)),
    case("min_axis0", _call("min", axis=0), GRID(3, 4)),
    case("min_neg_keep", _call("min", axis=(-1, -3), keepdims=True), GRID(2, 3, 2)),
    case("var_all", _call("var"), ANY(3, 4)),
    case("var_axis_corr", _call("var", axis=1, correction=1), ANY(3, 4)),
    case("var_tuple_keep", _call("var", axis=(0, -1), correction=0.5, keepdims=True), ANY(2, 3, 2)),
    case("std_all_corr", _call("std", correction=1), ANY(3, 4)),
    case("std_axis_keep", _call("std", axis=0, keepdims=True), ANY(3, 4)),
    case("std_tuple", _call("std", axis=(0, 2), correction=1), ANY(2, 3, 2)),
    case("logsumexp_all", _call("logsumexp"), ANY(3, 4)),
    case("logsumexp_axis_keep", _call("logsumexp", axis=1, keepdims=True), ANY(3, 4)),
    case("logsumexp_tuple", _call("logsumexp", axis=(0, -1)), ANY(2, 3, 2)),
    case("logsumexp_huge", _call("logsumexp", axis=0), HUGE(3, 4)),
    case("log_softmax", _call("log_softmax"), ANY(3, 4)),
    case("log_softmax_axis0", _call("log_softmax", axis=0), ANY(2, 3, 2)),
    case("log_softmax_huge", _call("log_softmax"), HUGE(3, 4)),
    case("softmax", _call("softmax", axis=-1), ANY(3, 4)),
    case("softmax_axis1", _call("softmax", axis=1), ANY(2, 3, 2)),
    case("softmax_huge", _call("softmax", axis=0), HUGE(3, 4)),
    # matmul: 2-D, batched, broadcast batch dimensions, 1-D on either side and both
    case("matmul_2d", _call("matmul"), ANY(3, 4), ANY(4, 2)),
    case("matmul_batched", _call("matmul"), ANY(2, 3, 2), ANY(2, 2, 3)),
    case("matmul_broadcast", _call("matmul"), ANY(2, 1, 3, 2), ANY(3, 2, 2)),
    case("matmul_batch_2d", _call("matmul"), ANY(2, 3, 2), ANY(2, 4)),
    case("matmul_2d_batch", _call("matmul"), ANY(2, 3), ANY(2, 3, 2)),
    case("matmul_vector_left", _call("matmul"), ANY(3), ANY(2, 3, 2)),
    case("matmul_vector_right", _call("matmul"), ANY(2, 3, 2), ANY(2)),
    case("matmul_dot", _call("matmul"), ANY(5), ANY(5)),
    case("matmul_same", lambda ad, x: x @ x.mT, ANY(3, 4)),
    # linear(x, weight, bias) = x @ weight.mT + bias: with and without bias, batched, 1-D x
    case("linear", _call("linear"), ANY(3, 4), ANY(2, 4), ANY(2)),
    case("linear_batched", _call("linear"), ANY(2, 2, 3), ANY(4, 3)),
    case("linear_vector", _call("linear"), ANY(4), ANY(3, 4), ANY(3)),
    # shapes
    case("reshape", lambda ad, x: ad.reshape(x, (2, 6)) * ad.asarray(np.arange(6.0)), ANY(3, 4)),
    case("reshape_flat", lambda ad, x: ad.reshape(x, (-1,)), ANY(2, 3, 2)),
    case("permute_dims", _call("permute_dims", axes=(2, 0, 1)), ANY(2, 3, 2)),
    case("permute_dims_neg", _call("permute_dims", axes=(-1, 0, -2)), ANY(2, 3, 2)),
    case("matrix_transpose", _call("matrix_transpose"), ANY(2, 3, 2)),
    case("T", lambda ad, x: x.T @ ad.asarray(np.ones((3, 2))), ANY(3, 4)),
    case("mT", lambda ad, x: x.mT * ad.asarray(np.arange(3.0)), ANY(2, 3, 2)),
    case(
        "expand_dims",
        lambda ad, x: ad.expand_dims(x, axis=1) * ad.asarray(np.ones((2, 1))),
        ANY(3, 4),
    ),
    case("expand_dims_neg", _call("expand_dims", axis=-1), ANY(3, 4)),
    case("squeeze", _call("squeeze", axis=1), ANY(3, 1, 4)),
    case("squeeze_tuple", _call("squeeze", axis=(0, -1)), ANY(1, 3, 4, 1)),
    case("broadcast_to", _call("broadcast_to", shape=(2, 3, 4)), ANY(3, 1)),
    case("broadcast_to_same", _call("broadcast_to", shape=(3, 4)), ANY(3, 4)),
    case("concat", lambda ad, a, b: ad.concat([a, b, a]), ANY(2, 3), ANY(1, 3)),
    case("concat_neg", lambda ad, a, b: ad.concat([a, b], axis=-1), ANY(2, 3), ANY(2, 2)),
    case("concat_none", lambda ad, a, b: ad.concat([a, b], axis=None), ANY(2, 3), ANY(4)),
    case("stack", lambda ad, a, b: ad.stack([a, b, a]), ANY(3, 4), ANY(3, 4)),
    case("stack_neg", lambda ad, a, b: ad.stack([a, b], axis=-1), ANY(2, 3), ANY(2, 3)),
    case("flip_all", _call("flip"), ANY(3, 4)),
    case("flip_axis", _call("flip", axis=0), ANY(3, 4)),
    case("flip_tuple", _call("flip", axis=(0, -1)), ANY(2, 3, 2)),
    # gathers: repeated and negative indices, whose gradients add up
    case("take", lambda ad, x: ad.take(x, _index(ad, [0, -1, 0, 2, 0])), ANY(4)),
    case("take_axis", lambda ad, x: ad.take(x, _index(ad, [3, 1, 3, -1]), axis=1), ANY(3, 4)),
    case("take_axis0", lambda ad, x: ad.take(x, _index(ad, [1, 1, -2]), axis=0), ANY(2, 3, 2)),
    case(
        "take_along",
        lambda ad, x: ad.take_along_axis(x, _index(ad, [[0, 3, 3], [1, 1, 1], [2, 0, -1]]), axis=1),
        ANY(3, 4),
    ),
    case(
        "take_along_axis0",
        lambda ad, x: ad.take_along_axis(x, _index(ad, [[2, 0, 2, 2], [0, 0, 1, 2]]), axis=0),
        ANY(3, 4),
    ),
    # x broadcast against the indices on the other axes: its gradient sums over them
    case(
        "take_along_broadcast",
        lambda ad, x: ad.take_along_axis(x, _index(ad, [[0, 3], [1, 1], [3, -1]]), axis=1),
        ANY(1, 4),
    ),
    case(
        "take_along_length_one",
        lambda ad, x: ad.take_along_axis(x, _index(ad, [[0, 0], [0, -1], [0, 0]]), axis=1),
        ANY(3, 1),
    ),
    # basic indexing: slices with steps (negative too), integers, Ellipsis, None
    case("slices", lambda ad, x: x[::2, 1:3], ANY(3, 4)),
    case("slices_neg_step", lambda ad, x: x[::-2, ::-3], ANY(3, 4)),
    case("int", lambda ad, x: x[1], ANY(3, 4), namespaces=NOT_STRICT),
    case("int_ellipsis", lambda ad, x: x[1, ...] + x[-1, ...], ANY(3, 4)),
    case("ellipsis", lambda ad, x: x[..., 1] * x[..., ::-1, 0], ANY(2, 3, 2)),
    case("none", lambda ad, x: x[None, 1:, None, ::2], ANY(3, 4)),
    case("mixed", lambda ad, x: x[1, None, ..., ::-1], ANY(2, 3, 2)),
    # integer-array indexing with repeated indices
    case("int_array", lambda ad, x: x[_index(ad, [0, 2, 2, -1])], ANY(3, 4), namespaces=NOT_STRICT),
    # a list is an integer-array key to numpy and to the remote namespace (not to the standard)
    case("list", lambda ad, x: x[[0, 2, 2, -1]], ANY(3, 4), namespaces=NOT_STRICT),
    case("lists", lambda ad, x: x[[0, 2, 2, -1], [1, 1, 1, 3]], ANY(3, 4), namespaces=NOT_STRICT),
    case(
        "int_arrays",
        lambda ad, x: x[_index(ad, [0, 2, 2, -1]), _index(ad, [1, 1, 1, 3])],
        ANY(3, 4),
    ),
    case("int_array_int", lambda ad, x: x[_index(ad, [[0, 2], [2, -1]]), 1], ANY(3, 4)),
    case("int_array_1d", lambda ad, x: x[_index(ad, [[0, 4], [4, 4], [-5, 1]])], ANY(5)),
    # where, clip (scalar bounds, array bounds, bounds that require grad), casts
    case("where", lambda ad, a, b: ad.where(a > 0.0, a, b), ANY(3, 4), ANY(4)),
    case(
        "where_scalar",
        lambda ad, x: ad.where(x > 0.0, x, 0.0) + ad.where(x < 0.0, -1.0, x),
        ANY(3, 4),
    ),
    case(
        "where_broadcast",
        lambda ad, a, b: ad.where(ad.asarray(np.array([True, False, True]))[:, None], a, b),
        ANY(3, 1),
        ANY(1, 4),
    ),
    case("clip", _call("clip", min=-0.3, max=0.45), GRID(3, 4)),
    case("clip_min", _call("clip", min=-0.3), GRID(3, 4)),
    case("clip_max", lambda ad, x: ad.clip(x, max=0.45), GRID(3, 4)),
    case(
        "clip_array_bounds",
        lambda ad, x: ad.clip(
            x, ad.asarray(np.full(4, -0.3)), ad.asarray(np.array([0.2, 0.45, 0.7, 10.0]))
        ),
        GRID(3, 4),
    ),
    case(
        "clip_grad_bounds",
        lambda ad, x, lo, hi: ad.clip(x, lo, hi),
        GRID(3, 4),
        LOWER(4),
        UPPER(3, 1),
    ),
    case("astype_same", lambda ad, x: ad.astype(x, ad.float64) * x, ANY(3, 4)),
    # through float32: the finite difference is taken in float32, so a larger step and a looser
    # tolerance (the step's float32 rounding is ~1e-4 of it); the gradient comes back float64
    case(
        "astype_float32",
        lambda ad, x: ad.astype(ad.square(ad.astype(x, ad.float32)) * 3.0, ad.float64),
        ANY(3, 4),
        eps=1e-3,
        tol=1e-3,
    ),
    # a float32 output (its output gradient is float32 too): the float64 input's gradient is
    # float64 all the same; the function is linear, so a larger step costs no accuracy
    case(
        "astype_float32_out",
        lambda ad, x: ad.astype(x, ad.float32) * 3.0,
        ANY(3, 4),
        eps=1e-2,
        tol=1e-3,
    ),
    # Tensorwire's neural-network extension (array_api_strict has none: NN)
    case(
        "conv2d",
        lambda ad, x, w, b: ad.conv(
            x, w, b, stride=(2, 1), padding=((1, 0), (1, 1)), dilation=(1, 2), groups=2
        ),
        ANY(2, 4, 5, 6),
        ANY(6, 2, 3, 2),
        ANY(6),
        namespaces=NN,
    ),
    case(
        "conv_transpose2d",
        lambda ad, x, w, b: ad.conv_transpose(
            x, w, b, stride=(2, 3), padding=((1, 0), (0, 1)), output_padding=(1, 2), groups=2
        ),
        ANY(2, 4, 3, 2),
        ANY(4, 3, 3, 2),
        ANY(6),
        namespaces=NN,
    ),
    case(
        "max_pool2d",
        lambda ad, x: ad.max_pool(x, kernel=(3, 2), stride=(2, 1), padding=(1, 1)),
        GRID(2, 2, 5, 4),
        namespaces=NN,
    ),
    case(
        "avg_pool1d",
        lambda ad, x: ad.avg_pool(
            x, kernel=(3,), stride=(2,), padding=(1,), count_include_pad=False
        ),
        ANY(2, 3, 6),
        namespaces=NN,
    ),
    case(
        "batch_norm_training",  # the batch's statistics: their gradients flow back into x
        lambda ad, x, w, b: ad.batch_norm(
            x, ad.mean(x, axis=(0, 2)), ad.var(x, axis=(0, 2)), w, b, eps=1e-5
        ),
        ANY(4, 3, 5),
        ANY(3),
        ANY(3),
        namespaces=NN,
    ),
    case(
        "batch_norm_statistics",
        lambda ad, x, m, v: ad.batch_norm(x, m, v, eps=1e-3),
        ANY(2, 3, 2, 2),
        ANY(3),
        POS(3),
        namespaces=NN,
    ),
    # a small network: a layer, cross-entropy of its log-softmax at labels
    case(
        "network",
        lambda ad, x, w, b: (
            -ad.mean(
                ad.take_along_axis(
                    ad.log_softmax(ad.tanh(x @ w + b)), _index(ad, [[1], [0], [2]]), axis=1
                )
            )
        ),
        ANY(3, 4),
        ANY(4, 3),
        ANY(3),
    ),
]

# --- the checks --------------------------------------------------------------------------------


def _seed(case: Case) -> int:
    return zlib.crc32(case.id.encode())


def _inputs(case: Case) -> list[Array]:
    rng = np.random.default_rng(_seed(case))
    return [spec.make(rng) for spec in case.specs]


def _weights(case: Case, shape: tuple[Any, ...]) -> Array:
    """The fixed output gradient: random, so each output element counts differently."""
    return np.random.default_rng([_seed(case), 1]).uniform(-1.5, 1.5, shape)


def _gradients(xp: Any, case: Case, inputs: list[Array]) -> list[Array]:
    """The autodiff gradients of ``sum(f(inputs) * w)`` on namespace ``xp``, read back."""
    ad = Autodiff(xp)
    leaves = [ad.asarray(a, requires_grad=True) for a in inputs]
    out = case.f(ad, *leaves)
    assert out.requires_grad, case.id
    ad.sum(out * ad.asarray(_weights(case, out.shape), dtype=out.dtype)).backward()
    grads = []
    for leaf, a in zip(leaves, inputs, strict=True):
        assert leaf.grad is not None
        grad = np.asarray(leaf.grad.array)
        assert grad.dtype == np.float64 and grad.shape == a.shape, case.id
        grads.append(grad)
    return grads


def _finite_differences(xp: Any, case: Case, inputs: list[Array]) -> list[Array]:
    """Central differences of the same function on the same namespace: every perturbed
    evaluation is queued first, then all are read at once (one round trip remotely)."""
    ad = Autodiff(xp)
    constants = [ad.asarray(a) for a in inputs]
    out = case.f(ad, *constants)
    w = ad.asarray(_weights(case, out.shape), dtype=out.dtype)
    losses = []
    steps = []
    for i, a in enumerate(inputs):
        for j in range(a.size):
            for sign in (1.0, -1.0):
                moved = a.copy()
                moved.flat[j] += sign * case.eps
                args = [*constants[:i], ad.asarray(moved), *constants[i + 1 :]]
                losses.append(ad.sum(case.f(ad, *args) * w).array)
            steps.append((a.flat[j] + case.eps) - (a.flat[j] - case.eps))  # as represented
    values = np.asarray(xp.stack(losses))
    differences = (values[0::2] - values[1::2]) / np.asarray(steps)
    assert np.isfinite(differences).all(), case.id
    sizes = np.cumsum([a.size for a in inputs])[:-1]
    return [d.reshape(a.shape) for d, a in zip(np.split(differences, sizes), inputs, strict=True)]


def _check(xp: Any, case: Case) -> list[Array]:
    inputs = _inputs(case)
    grads = _gradients(xp, case, inputs)
    expected = _finite_differences(xp, case, inputs)
    for i, (grad, fd) in enumerate(zip(grads, expected, strict=True)):
        np.testing.assert_allclose(grad, fd, rtol=case.tol, atol=case.tol, err_msg=f"input {i}")
    return grads


def _cases(namespace: str) -> list[Any]:
    return [pytest.param(c, id=c.id) for c in CASES if namespace in c.namespaces]


@pytest.mark.parametrize("case", _cases("remote"))
def test_remote_gradients_match_finite_differences_and_numpy(
    xp: client.Namespace, case: Case
) -> None:
    grads = _check(xp, case)
    # Exactly numpy's: the server runs the same numpy calls on the same float64 values.
    for remote, local in zip(grads, _gradients(np, case, _inputs(case)), strict=True):
        np.testing.assert_array_equal(remote, local)


@pytest.mark.parametrize("case", _cases("numpy"))
def test_numpy_gradients_match_finite_differences(case: Case) -> None:
    _check(np, case)


@pytest.mark.parametrize("case", _cases("array_api_strict"))
def test_array_api_strict_gradients_match_finite_differences(case: Case) -> None:
    _check(array_api_strict, case)


def _recorded_ops(root: Tensor) -> set[str]:
    """The names of the ops recorded in ``root``'s graph (walked through each tensor's node)."""
    names: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()._node
        if node is not None:
            names.add(node.name)
            stack.extend(node.inputs)
    return names


# Names in DIFFERENTIABLE that no case records under that name, each with why. ``getitem``
# records as ``__getitem__`` (the operator is how it is called), mapped below.
NOT_RECORDED: dict[str, str] = {}


def test_the_cases_cover_every_differentiable_op_on_every_namespace() -> None:
    recorded: set[str] = set()
    for c in CASES:
        ad = Autodiff(np)
        out = c.f(ad, *(ad.asarray(a, requires_grad=True) for a in _inputs(c)))
        recorded |= _recorded_ops(out)
    recorded = {"getitem" if name == "__getitem__" else name for name in recorded}
    assert recorded == set(DIFFERENTIABLE) - set(NOT_RECORDED)
    assert len({c.id for c in CASES}) == len(CASES)
    # every case runs through the server and on numpy; on array_api_strict all but the five
    # whose keys or operands the standard leaves unspecified (their twins run there) and the
    # neural-network extension's
    assert all(c.namespaces[:2] == ("remote", "numpy") for c in CASES)
    assert {c.id for c in CASES if "array_api_strict" not in c.namespaces} == {
        "int",
        "int_array",
        "list",
        "lists",
        "plain_left",
        *(c.id for c in CASES if c.namespaces == NN),
    }


# --- properties: broadcasting and reductions, through the server ----------------------------

HYPOTHESIS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _check_remote_against_numpy(xp: client.Namespace, c: Case) -> None:
    for remote, local in zip(_check(xp, c), _gradients(np, c, _inputs(c)), strict=True):
        np.testing.assert_array_equal(remote, local)


@HYPOTHESIS
@given(
    op=st.sampled_from(BINARY + [("where", ANY, ANY)]),
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
)
def test_binary_ops_broadcast_any_shapes(
    xp: client.Namespace, op: tuple[str, Callable[..., Spec], Callable[..., Spec]], shapes: Any
) -> None:
    name, left, right = op
    a, b = shapes.input_shapes
    assume(math.prod(a) + math.prod(b) <= 16)
    if name == "where":  # a fixed condition of the result's shape: it broadcasts with both
        shape = shapes.result_shape
        condition = np.arange(math.prod(shape)).reshape(shape) % 3 != 1

        def f(ad: Autodiff, x: Tensor, y: Tensor) -> Tensor:
            return ad.where(ad.asarray(condition), x, y)
    else:
        f = _call(name)
    _check_remote_against_numpy(xp, case(f"{name}{a}{b}", f, left(*a), right(*b)))


REDUCTIONS = ["sum", "mean", "max", "min", "var", "std", "logsumexp"]


@HYPOTHESIS
@given(
    name=st.sampled_from(REDUCTIONS),
    shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3),
    data=st.data(),
)
def test_reductions_over_any_axes(
    xp: client.Namespace, name: str, shape: tuple[int, ...], data: st.DataObject
) -> None:
    assume(math.prod(shape) <= 12)
    ndim = len(shape)
    some = st.lists(
        st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim, unique_by=lambda a: a % ndim
    )
    axes = data.draw(some | st.none(), label="axes")
    axis: Any = axes if axes is None else (axes[0] if len(axes) == 1 else tuple(axes))
    count = math.prod(shape) if axes is None else math.prod(shape[a] for a in axes)
    assume(name != "std" or count > 1)  # std is not differentiable where it is 0: one element
    kwargs: dict[str, Any] = {"axis": axis, "keepdims": data.draw(st.booleans(), label="keepdims")}
    if name in ("var", "std"):
        kwargs["correction"] = data.draw(st.sampled_from([0, 1] if count > 1 else [0]))
    spec = GRID if name in ("max", "min") else ANY
    _check_remote_against_numpy(
        xp, case(f"{name}{shape}{kwargs}", _call(name, **kwargs), spec(*shape))
    )
