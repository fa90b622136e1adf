"""client.nn's convolutional, pooling, normalization, dropout and attention layers and
functions: PyTorch's defaults and shapes, the results of a real server (and of numpy) against
the references of tests/nn_reference.py, and the gradients of the composed functions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import client
from client import nn
from client.autodiff import Autodiff, Tensor, no_grad
from client.capture import jit
from client.nn import functional as F

from . import nn_reference as ref
from .nn_reference import normal, values


@pytest.fixture
def ad(xp: client.Namespace) -> Autodiff:
    return Autodiff(xp)


# --- PyTorch's defaults and shapes ---------------------------------------------------------------


def test_convolutions_have_pytorchs_shapes_defaults_and_initialisation() -> None:
    conv = nn.Conv2d(3, 6, 5)
    assert (conv.stride, conv.padding, conv.dilation, conv.groups) == ((1, 1), (0, 0), (1, 1), 1)
    assert conv.weight.shape == (6, 3, 5, 5) and conv.bias is not None and conv.bias.shape == (6,)
    bound = 1 / math.sqrt(3 * 25)
    for p in (conv.weight, conv.bias):
        assert np.abs(values(p)).max() <= bound
    assert np.abs(values(conv.weight)).max() > 0.9 * bound  # drawn over the whole range
    assert repr(conv) == "Conv2d(3, 6, kernel_size=(5, 5), stride=(1, 1))"
    assert conv(normal(2, 3, 9, 9, dtype=np.float32)).shape == (2, 6, 5, 5)

    grouped = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2, bias=False)
    assert grouped.weight.shape == (8, 2, 3, 3) and grouped.bias is None
    assert np.abs(values(grouped.weight)).max() <= 1 / math.sqrt(2 * 9)
    assert grouped(normal(1, 4, 7, 7, dtype=np.float32)).shape == (1, 8, 4, 4)

    conv1 = nn.Conv1d(4, 8, 3, stride=2, padding=1)
    assert conv1.weight.shape == (8, 4, 3) and conv1.kernel_size == (3,)
    assert conv1(normal(2, 4, 10, dtype=np.float32)).shape == (2, 8, 5)
    assert conv1(normal(4, 10, dtype=np.float32)).shape == (8, 5)  # unbatched, as PyTorch's

    same = nn.Conv2d(2, 3, 4, padding="same", dilation=(1, 2))
    assert same.padding == "same" and same(normal(1, 2, 7, 6, dtype=np.float32)).shape == (
        1,
        3,
        7,
        6,
    )

    transposed = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    assert transposed.weight.shape == (4, 3, 3, 3)  # (in, out / groups, kH, kW)
    assert np.abs(values(transposed.weight)).max() <= 1 / math.sqrt(3 * 9)  # fan_in: shape[1]
    assert transposed(normal(2, 4, 5, 5, dtype=np.float32)).shape == (2, 6, 10, 10)


def test_pooling_flatten_and_batch_norm_have_pytorchs_defaults() -> None:
    x = normal(2, 3, 8, 8, dtype=np.float32)
    assert nn.MaxPool2d(2).stride == 2 and nn.MaxPool2d(2)(x).shape == (2, 3, 4, 4)
    assert nn.AvgPool2d(3, stride=2, padding=1)(x).shape == (2, 3, 4, 4)
    assert nn.Flatten()(x).shape == (2, 192)
    assert nn.Flatten(0, 1)(x).shape == (6, 8, 8)
    assert F.flatten(x).shape == (384,)

    bn = nn.BatchNorm2d(3)
    assert (bn.eps, bn.momentum, bn.affine, bn.track_running_stats) == (1e-5, 0.1, True, True)
    assert [name for name, _ in bn.named_parameters()] == ["weight", "bias"]
    buffers = dict(bn.named_buffers())
    assert list(buffers) == ["running_mean", "running_var", "num_batches_tracked"]
    np.testing.assert_array_equal(values(bn.weight), np.ones(3, np.float32))
    np.testing.assert_array_equal(values(bn.bias), np.zeros(3, np.float32))
    np.testing.assert_array_equal(values(buffers["running_var"]), np.ones(3, np.float32))
    assert (
        buffers["num_batches_tracked"].shape == ()
        and values(buffers["num_batches_tracked"]).dtype == np.int64
    )
    assert not any(b.requires_grad for b in bn.buffers())
    bare = nn.BatchNorm1d(4, affine=False, track_running_stats=False)
    assert list(bare.state_dict()) == [] and bare.running_mean is None
    assert bare(normal(5, 4)).shape == (5, 4)


def test_multihead_attention_has_pytorchs_parameters_and_initialisation() -> None:
    mha = nn.MultiheadAttention(16, 4)
    assert mha.batch_first is False and mha.head_dim == 4 and mha.dropout == 0.0
    shapes = {name: tuple(value.shape) for name, value in mha.state_dict().items()}
    assert shapes == {  # PyTorch's names, order and layouts
        "in_proj_weight": (48, 16),
        "in_proj_bias": (48,),
        "out_proj.weight": (16, 16),
        "out_proj.bias": (16,),
    }
    state = {name: values(v) for name, v in mha.state_dict().items()}
    xavier = math.sqrt(6 / (16 + 48))
    assert xavier * 0.9 < np.abs(state["in_proj_weight"]).max() <= xavier
    assert np.abs(state["out_proj.weight"]).max() <= 1 / 4  # a Linear's
    assert not state["in_proj_bias"].any() and not state["out_proj.bias"].any()
    out, weights = mha(*(normal(5, 2, 16, dtype=np.float32),) * 3)  # (L, N, E)
    assert out.shape == (5, 2, 16) and weights is not None and weights.shape == (2, 5, 5)
    no_bias = nn.MultiheadAttention(8, 2, bias=False, batch_first=True)
    assert list(no_bias.state_dict()) == ["in_proj_weight", "out_proj.weight"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: nn.Conv2d(4, 6, 3, groups=4), "divisible by groups"),
        (lambda: nn.Conv2d(2, 2, 3, stride=2, padding="same"), "strided"),
        (lambda: nn.Conv2d(2, 2, 3, padding="full"), "padding='full'"),
        (lambda: nn.Conv2d(2, 2, (3, 3, 3)), "kernel_size must be an int or 2 ints"),
        (lambda: nn.MaxPool2d(2, ceil_mode=True), "ceil_mode"),
        (lambda: nn.MultiheadAttention(10, 3), "divisible by num_heads"),
        (lambda: nn.MultiheadAttention(8, 2, kdim=4), "kdim"),
        (lambda: F.conv2d(np.ones((1, 3, 5, 5)), np.ones((2, 2, 3, 3))), "2 input channels"),
        (lambda: F.conv2d(np.ones((3, 5)), np.ones((2, 3, 3, 3))), "expected a 4-D input"),
        (lambda: F.conv2d(np.ones((1, 2, 2, 2)), np.ones((1, 2, 3, 3))), "larger than"),
        (lambda: F.conv2d(np.ones((1, 2, 5, 5)), np.ones((3, 2, 3, 3)), np.ones(2)), "bias"),
        (
            lambda: F.conv2d(np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3))),
            "weight is float64 but the input is float32",
        ),
        (
            lambda: F.conv_transpose2d(np.ones((1, 2, 3, 3)), np.ones((2, 1, 3, 3)), None, 2, 0, 2),
            "output_padding",
        ),
        (lambda: F.max_pool2d(np.ones((1, 1, 6, 6)), 3, padding=2), "at most half"),
        (lambda: F.avg_pool2d(np.ones((1, 1, 6, 6)), 2, ceil_mode=True), "ceil_mode"),
        (lambda: F.softmax(np.ones((2, 3)), 2), "dim must be"),
        (lambda: F.batch_norm(np.ones((1, 3)), None, None, training=True), "more than 1 value"),
        (lambda: F.batch_norm(np.ones((4, 3)), None, None), "running_mean and running_var"),
        (lambda: nn.BatchNorm2d(3)(np.ones((4, 3))), r"\(N, C, H, W\), got a 2-D"),
        (
            lambda: F.scaled_dot_product_attention(*(np.ones((2, 3, 4)),) * 3, np.ones((2, 2))),
            "does not broadcast",
        ),
        (
            lambda: F.scaled_dot_product_attention(
                *(np.ones((3, 4)),) * 3, np.ones((3, 3), bool), is_causal=True
            ),
            "not both",
        ),
    ],
)
def test_mistakes_are_refused_on_the_client_naming_the_argument(call: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# --- results against the references, on a server ------------------------------------------------

CONV2D_CASES = [
    {"stride": 2, "padding": 1},
    {"padding": "same"},  # a 4x4 kernel: one row and column more after than before
    {"padding": (1, 2), "dilation": 2, "groups": 2},
    {"padding": "valid", "stride": (1, 2)},
]


@pytest.mark.parametrize("options", CONV2D_CASES)
def test_conv2d_matches_the_reference(ad: Autodiff, options: dict[str, Any]) -> None:
    x, w, b = normal(2, 4, 9, 8), normal(6, 4 // options.get("groups", 1), 4, 4, seed=1), normal(6)
    out = values(F.conv2d(ad.asarray(x), ad.asarray(w), ad.asarray(b), **options))
    padding = options.get("padding", 0)
    dilation = options.get("dilation", 1)
    if padding == "same":
        pads = ((1, 2), (1, 2))  # total 3, as PyTorch splits it
    elif padding == "valid":
        pads = ((0, 0), (0, 0))
    else:
        p = (padding, padding) if isinstance(padding, int) else padding
        pads = ((p[0], p[0]), (p[1], p[1]))
    stride = options.get("stride", 1)
    expected = ref.conv2d(
        x,
        w,
        b,
        stride=(stride, stride) if isinstance(stride, int) else stride,
        pads=pads,
        dilation=(dilation, dilation),
        groups=options.get("groups", 1),
    )
    if padding == "same":
        assert out.shape == (2, 6, 9, 8)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_conv_transpose2d_picks_its_output_padding_from_output_size_as_pytorchs() -> None:
    """PyTorch's ConvTranspose2d.forward(input, output_size): the sizes a strided Conv2d maps
    to the input's size are min ... min + stride - 1 per dimension, min the size without
    output_padding; output_size (N, C, H, W) or (H, W) picks one, overriding output_padding."""
    up = nn.ConvTranspose2d(4, 6, 3, stride=(2, 3), padding=1, output_padding=1, dtype="float64")
    x = normal(2, 4, 5, 4)
    weight, bias = up.weight, up.bias
    for size, extra in (((9, 10), (0, 0)), ((10, 12), (1, 2)), ((2, 6, 10, 11), (1, 1))):
        want = F.conv_transpose2d(x, weight, bias, (2, 3), 1, extra)
        got = up(x, output_size=size)
        assert got.shape == (2, 6, *size[-2:])
        np.testing.assert_array_equal(values(got), values(want))
    unbatched = up(x[0], output_size=[10, 12])  # (C, H, W): one sample, as PyTorch's
    np.testing.assert_array_equal(values(unbatched), values(up(x, output_size=(10, 12)))[0])
    for size in ((8, 10), (9, 13), (9,), (1, 9, 10)):
        with pytest.raises(ValueError, match=r"output_size"):
            up(x, output_size=size)


def test_conv1d_is_conv2d_over_one_row(ad: Autodiff) -> None:
    x, w = normal(2, 4, 11), normal(6, 2, 3, seed=1)
    out = values(F.conv1d(ad.asarray(x), ad.asarray(w), None, 2, 1, 2, 2))
    expected = ref.conv2d(
        x[:, :, None], w[:, :, None], None, (1, 2), ((0, 0), (1, 1)), (1, 2), groups=2
    )
    np.testing.assert_allclose(out, expected[:, :, 0], rtol=1e-12, atol=1e-12)


def test_conv_transpose2d_matches_the_reference_and_is_conv2ds_adjoint(ad: Autodiff) -> None:
    x, w, b = normal(2, 4, 5, 4), normal(4, 3, 3, 2, seed=1), normal(6, seed=2)
    out = values(F.conv_transpose2d(ad.asarray(x), ad.asarray(w), ad.asarray(b), 2, 1, 1, 2))
    expected = ref.conv_transpose2d(x, w, b, (2, 2), (1, 1), (1, 1), groups=2)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    # <conv2d(y, w), x> == <y, conv_transpose2d(x, w)>: the same weight, both ways
    y = normal(*out.shape, seed=3)
    down = values(F.conv2d(ad.asarray(y), ad.asarray(w), None, 2, 1, 1, 2))
    up = values(F.conv_transpose2d(ad.asarray(x), ad.asarray(w), None, 2, 1, 1, 2))
    assert np.vdot(down[:, :, : x.shape[2], : x.shape[3]], x) == pytest.approx(np.vdot(y, up))


@pytest.mark.parametrize("count_include_pad", [True, False])
def test_pooling_matches_the_reference(ad: Autodiff, count_include_pad: bool) -> None:
    x = normal(2, 3, 9, 8)
    maxed = values(F.max_pool2d(ad.asarray(x), (3, 2), (2, 2), (1, 1)))
    np.testing.assert_array_equal(maxed, ref.pool2d("max", x, (3, 2), (2, 2), (1, 1)))
    averaged = F.avg_pool2d(ad.asarray(x), 3, 2, 1, count_include_pad=count_include_pad)
    expected = ref.pool2d("avg", x, (3, 3), (2, 2), (1, 1), count_include_pad)
    np.testing.assert_allclose(values(averaged), expected, rtol=1e-12)


def test_softmax_and_log_softmax_along_a_dim(ad: Autodiff) -> None:
    z = normal(3, 4, 5) * 30
    np.testing.assert_allclose(values(F.softmax(ad.asarray(z), 1)), ref.softmax(z, 1), rtol=1e-12)
    logged = values(F.log_softmax(ad.asarray(z), dim=-1))
    np.testing.assert_allclose(np.exp(logged), ref.softmax(z), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_updates_running_stats_on_the_device_and_evaluates_with_them(
    ad: Autodiff, dtype: Any
) -> None:
    bn = nn.BatchNorm2d(3, ad=ad, dtype=dtype)
    buffers = {name: b.array for name, b in bn.named_buffers()}
    batches = [normal(4, 3, 5, 5, seed=s, dtype=dtype) * 2 + 1 for s in range(3)]
    mean, var = np.zeros(3), np.ones(3)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12}
    for x in batches[:2]:
        out = values(bn(ad.asarray(x)))
        m, v = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        np.testing.assert_allclose(out, ref.batch_norm(x, m, v), **tolerance)
        mean = 0.9 * mean + 0.1 * m
        var = 0.9 * var + 0.1 * v * 100 / 99  # PyTorch keeps the unbiased variance
    state = {name: values(b) for name, b in bn.named_buffers()}
    np.testing.assert_allclose(state["running_mean"], mean, **tolerance)
    np.testing.assert_allclose(state["running_var"], var, **tolerance)
    assert state["num_batches_tracked"] == 2
    assert all(b.array is buffers[name] for name, b in bn.named_buffers())  # in place
    bn.eval()
    out = values(bn(ad.asarray(batches[2])))
    np.testing.assert_allclose(out, ref.batch_norm(batches[2], mean, var), **tolerance)
    assert values(bn.num_batches_tracked) == 2  # evaluation leaves the statistics alone
    np.testing.assert_allclose(values(bn.running_mean), mean, **tolerance)


def test_batch_norm_without_momentum_keeps_the_average_of_every_batchs_statistics(
    ad: Autodiff,
) -> None:
    """PyTorch's momentum=None: a cumulative average, the n-th batch weighted 1/n by
    num_batches_tracked (on the device here, so a replayed step counts too)."""
    bn = nn.BatchNorm1d(3, momentum=None, ad=ad, dtype="float64")
    batches = [normal(5, 3, 4, seed=s) * (s + 1) + s for s in range(3)]
    for x in batches:
        bn(ad.asarray(x))
    means = [x.mean(axis=(0, 2)) for x in batches]
    variances = [x.var(axis=(0, 2), ddof=1) for x in batches]  # unbiased, as PyTorch keeps
    np.testing.assert_allclose(values(bn.running_mean), np.mean(means, axis=0), rtol=1e-12)
    np.testing.assert_allclose(values(bn.running_var), np.mean(variances, axis=0), rtol=1e-12)
    assert values(bn.num_batches_tracked) == 3 and "momentum=None" in repr(bn)

    replayed = nn.BatchNorm1d(3, momentum=None, ad=ad, dtype="float64")
    step = jit(lambda x: replayed(x))
    for x in batches:
        step(ad.asarray(x))
    assert step.recorded == 1  # replayed twice, each replay weighing its own batch
    np.testing.assert_allclose(values(replayed.running_var), values(bn.running_var), rtol=1e-12)
    assert values(replayed.num_batches_tracked) == 3


def test_batch_norm_1d_over_features_and_over_sequences(ad: Autodiff) -> None:
    bn = nn.BatchNorm1d(4, ad=ad, dtype="float64")
    with_length = normal(6, 4, 3)
    flat = normal(6, 4, seed=1)
    for x, axes in ((with_length, (0, 2)), (flat, (0,))):
        out = values(bn(ad.asarray(x)))
        np.testing.assert_allclose(out, ref.batch_norm(x, x.mean(axes), x.var(axes)), rtol=1e-12)
    assert values(bn.num_batches_tracked) == 2


def test_scaled_dot_product_attention_matches_the_reference(ad: Autodiff) -> None:
    q, k, v = normal(2, 3, 5, 4), normal(2, 3, 6, 4, seed=1), normal(2, 3, 6, 7, seed=2)
    allowed = np.random.default_rng(3).random((5, 6)) < 0.6
    allowed[:, 0] = True  # every row attends somewhere
    added = normal(2, 1, 5, 6, seed=4)
    cases = [
        ({}, {}),
        ({"is_causal": True}, {"allowed": np.tri(5, 6, dtype=bool)}),
        ({"attn_mask": allowed}, {"allowed": allowed}),
        ({"attn_mask": added, "scale": 0.3}, {"added": added, "scale": 0.3}),
    ]
    tensors = [ad.asarray(t) for t in (q, k, v)]
    for options, reference in cases:
        out = F.scaled_dot_product_attention(*tensors, **options)
        expected, _ = ref.attention(q, k, v, **reference)
        np.testing.assert_allclose(values(out), expected, rtol=1e-12, atol=1e-14)


def test_a_row_with_nowhere_to_attend_gives_zeros_and_no_nan_gradient(ad: Autodiff) -> None:
    """PyTorch's scaled_dot_product_attention (its safe softmax, since 2.5): a query row that
    every mask entry excludes, by a boolean mask or an added -inf, gives zeros and sends no
    gradient (NaN there would reach every parameter through a loss that ignores the row,
    as it does with left padding under a causal mask)."""
    q, k, v = normal(2, 3, 4, 5), normal(2, 3, 6, 5, seed=1), normal(2, 3, 6, 7, seed=2)
    allowed = np.random.default_rng(3).random((4, 6)) < 0.6
    allowed[:, 0], allowed[2] = True, False  # row 2 attends nowhere
    added = np.where(allowed, normal(4, 6, seed=4), -np.inf)
    r = normal(2, 3, 4, 7, seed=5)
    for mask, reference in ((allowed, {"allowed": allowed}), (added, {"added": added})):
        tensors = [ad.asarray(t, requires_grad=True) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*tensors, attn_mask=mask)
        ad.sum(out * ad.asarray(r)).backward()
        with np.errstate(invalid="ignore"):  # the reference's NaN row, not compared
            expected, _ = ref.attention(q, k, v, **reference)
        got = values(out)
        assert not np.any(got[..., 2, :]), mask.dtype
        others = [0, 1, 3]
        np.testing.assert_allclose(got[..., others, :], expected[..., others, :], rtol=1e-12)
        grads = [values(t.grad) for t in tensors]
        assert all(np.isfinite(g).all() for g in grads), mask.dtype
        assert not np.any(grads[0][..., 2, :]), mask.dtype


def test_multihead_attention_gives_nan_or_zeros_for_a_fully_masked_row_as_pytorch(
    ad: Autodiff,
) -> None:
    """PyTorch's MultiheadAttention computes with the weights (NaN in a row with nowhere to
    attend) when it returns them, and with scaled_dot_product_attention (zeros) when not."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True, ad=ad, dtype="float64")
    with no_grad():
        mha.out_proj.bias += ad.asarray(normal(8, seed=10))
    x = ad.asarray(normal(2, 5, 8))
    ignored = np.zeros((5, 5), bool)
    ignored[3] = True  # PyTorch's MultiheadAttention: True ignores
    out, weights = mha(x, x, x, attn_mask=ignored)
    assert weights is not None and np.isnan(values(weights)[:, 3]).all()
    assert np.isnan(values(out)[:, 3]).all() and np.isfinite(values(out)[:, [0, 1, 2, 4]]).all()
    out, _ = mha(x, x, x, attn_mask=ignored, need_weights=False)
    bias = values(mha.out_proj.bias)
    np.testing.assert_array_equal(values(out)[:, 3], np.broadcast_to(bias, (2, 8)))


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_matches_the_reference(ad: Autodiff, batch_first: bool) -> None:
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first, ad=ad, dtype="float64")
    with no_grad():
        mha.in_proj_bias += ad.asarray(normal(24, seed=9))  # PyTorch starts them at zero
        mha.out_proj.bias += ad.asarray(normal(8, seed=10))
    state = {name: values(v) for name, v in mha.state_dict().items()}
    x, memory = normal(2, 5, 8), normal(2, 6, 8, seed=1)
    ignored = np.zeros((2, 6), bool)
    ignored[0, 4:] = True
    causal = ~np.tri(5, 5, dtype=bool)  # PyTorch's MultiheadAttention: True ignores
    added = normal(5, 6, seed=2)

    def run(query: np.ndarray, key: np.ndarray, **masks: Any) -> tuple[np.ndarray, np.ndarray]:
        def layout(t: np.ndarray) -> Any:
            return ad.asarray(t if batch_first else t.transpose(1, 0, 2))

        q = layout(query)
        kv = q if key is query else layout(key)
        out, weights = mha(q, kv, kv, average_attn_weights=False, **masks)
        result = values(out)
        return (result if batch_first else result.transpose(1, 0, 2)), values(weights)

    cases = [
        (x, x, {"attn_mask": causal}),
        (x, x, {"is_causal": True}),
        (x, memory, {"key_padding_mask": ignored, "attn_mask": added}),
    ]
    for query, key, masks in cases:
        out, weights = run(query, key, **masks)
        reference_masks = {"ignored": masks.get("key_padding_mask")}
        if "is_causal" in masks:
            reference_masks["attn_mask"] = causal
        else:
            reference_masks["attn_mask"] = masks.get("attn_mask")
        expected, expected_weights = ref.multihead_attention(
            state, 2, query, key, key, **reference_masks
        )
        np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(weights, expected_weights, rtol=1e-10, atol=1e-12)
    out, averaged = mha(ad.asarray(x), ad.asarray(x), ad.asarray(x))
    assert averaged is not None and averaged.shape == ((2, 5, 5) if batch_first else (5, 2, 2))
    assert mha(ad.asarray(x), ad.asarray(x), ad.asarray(x), need_weights=False)[1] is None


def test_multihead_attention_takes_one_samples_key_padding_mask_as_pytorch(
    ad: Autodiff,
) -> None:
    """For an unbatched (L, E) query PyTorch takes key_padding_mask of shape (S,), and refuses
    a 2-D one; the result is the batched one's for a batch of that one sample."""
    mha = nn.MultiheadAttention(8, 2, ad=ad, dtype="float64")
    x, memory = normal(5, 8), normal(6, 8, seed=1)
    ignored = np.zeros(6, bool)
    ignored[4:] = True
    out, weights = mha(ad.asarray(x), ad.asarray(memory), ad.asarray(memory), ignored)
    batched = [ad.asarray(t[:, None]) for t in (x, memory, memory)]  # (L, N=1, E)
    want, want_weights = mha(*batched, key_padding_mask=ignored[None])
    np.testing.assert_allclose(values(out), values(want)[:, 0], rtol=1e-12)
    np.testing.assert_allclose(values(weights), values(want_weights)[0], rtol=1e-12)
    assert not values(weights)[:, 4:].any()
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(S,\)"):
        mha(ad.asarray(x), ad.asarray(memory), ad.asarray(memory), ignored[None])


# --- gradients of the composed functions, by central differences in float64 --------------------


def _check_gradients(ad: Autodiff, loss: Any, arrays: dict[str, np.ndarray]) -> None:
    """``loss(**tensors)``'s gradient along a random direction of each argument against the
    central difference of the loss along it."""
    tensors = {name: ad.asarray(a, requires_grad=True) for name, a in arrays.items()}
    loss(**tensors).backward()
    rng = np.random.default_rng(0)
    for name, array in arrays.items():
        direction = rng.standard_normal(array.shape)
        grad = tensors[name].grad
        assert grad is not None, name
        others = {k: ad.asarray(v) for k, v in arrays.items() if k != name}
        eps = 1e-6
        plus = float(loss(**others, **{name: ad.asarray(array + eps * direction)}))
        minus = float(loss(**others, **{name: ad.asarray(array - eps * direction)}))
        numeric = (plus - minus) / (2 * eps)
        assert float(np.vdot(values(grad), direction)) == pytest.approx(
            numeric, rel=1e-6, abs=1e-8
        ), name


def test_gradients_of_convolution_and_pooling(ad: Autodiff) -> None:
    r = ad.asarray(normal(2, 4, 3, 3, seed=5))

    def loss(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        y = F.conv2d(x, w, b, stride=2, padding=1, groups=2)  # (2, 4, 5, 4)
        y = F.max_pool2d(y, 2, 1)[..., :3, :] + F.avg_pool2d(y, (2, 3), 1, (1, 1))[..., :3, :3]
        result: Tensor = ad.sum(y * r)
        return result

    _check_gradients(ad, loss, {"x": normal(2, 4, 9, 7), "w": normal(4, 2, 3, 3), "b": normal(4)})


def test_gradients_of_batch_norm_in_training(ad: Autodiff) -> None:
    r = ad.asarray(normal(5, 3, 4, seed=5))

    def loss(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        result: Tensor = ad.sum(F.batch_norm(x, None, None, w, b, training=True) * r)
        return result

    _check_gradients(ad, loss, {"x": normal(5, 3, 4), "w": normal(3), "b": normal(3)})


def test_gradients_of_attention(ad: Autodiff) -> None:
    r = ad.asarray(normal(2, 3, 5, 4, seed=5))

    def loss(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        result: Tensor = ad.sum(out * r)
        return result

    shape = (2, 3, 5, 4)
    _check_gradients(ad, loss, {n: normal(*shape, seed=i) for i, n in enumerate("qkv")})
