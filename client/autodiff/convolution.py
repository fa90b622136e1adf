"""Convolutions and pooling with their gradients, over Tensorwire's neural-network extension
(``extension.py``): a convolution's input gradient is the transposed convolution and its weight
gradient the extension's ``conv_weight_grad``; a transposed convolution's are the convolution
and the same weight gradient with the roles of input and output swapped; a pooling's is
``pool_backward``.

Spatial parameters are tuples with one entry per spatial dimension (``len(stride)``), padding
a ``(before, after)`` pair per dimension for convolutions and one int per dimension (both
sides) for poolings; ``client.nn.functional`` resolves PyTorch's spellings into these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._common import as_tensor, same_device
from .extension import Pair, extension_of
from .tensor import Tensor, record

if TYPE_CHECKING:
    from .namespace import Autodiff


def _with_bias(ad: Autodiff, y: Any, bias: Tensor | None, dims: int) -> Any:
    if bias is None:
        return y
    return y + ad.xp.reshape(bias.array, (1, -1) + (1,) * dims)


def _bias_grad(ad: Autodiff, g: Any, bias: Tensor | None) -> tuple[Any, ...]:
    if bias is None:
        return ()
    return (ad.xp.sum(g, axis=(0, *range(2, g.ndim))) if bias.requires_grad else None,)


def _operands(
    ad: Autodiff, name: str, x: Any, weight: Any, bias: Any
) -> tuple[Tensor, Tensor, Tensor | None, tuple[Tensor, ...]]:
    t, w = as_tensor(ad, x), as_tensor(ad, weight)
    b = None if bias is None else as_tensor(ad, bias)
    return t, w, b, same_device(name, t, w, *(() if b is None else (b,)))


def conv(
    ad: Autodiff,
    x: Any,
    weight: Any,
    bias: Any = None,
    /,
    *,
    stride: Sequence[int],
    padding: Sequence[Pair],
    dilation: Sequence[int] | None = None,
    groups: int = 1,
) -> Tensor:
    """PyTorch's convolution (a cross-correlation) of ``x`` (N, C_in, *L) with ``weight``
    (C_out, C_in/groups, *k), plus ``bias`` (C_out,)."""
    t, w, b, inputs = _operands(ad, "conv", x, weight, bias)
    ext, dims = extension_of(ad.xp), len(stride)
    spatial = _spatial(stride, padding, dilation, groups)
    xa, wa = t.array, w.array
    y = _with_bias(ad, ext.conv(xa, wa, **spatial), b, dims)

    def backward(g: Any) -> tuple[Any, ...]:
        gx = gw = None
        if t.requires_grad:
            extra = _transpose_extra(tuple(xa.shape[2:]), tuple(g.shape[2:]), wa.shape[2:], spatial)
            gx = ext.conv_transpose(g, wa, **spatial, output_padding=extra)
        if w.requires_grad:
            gw = ext.conv_weight_grad(xa, g, kernel=tuple(wa.shape[2:]), **spatial)
        return (gx, gw, *_bias_grad(ad, g, b))

    return record(ad, "conv", y, inputs, backward)


def conv_transpose(
    ad: Autodiff,
    x: Any,
    weight: Any,
    bias: Any = None,
    /,
    *,
    stride: Sequence[int],
    padding: Sequence[Pair],
    output_padding: Sequence[int] | None = None,
    dilation: Sequence[int] | None = None,
    groups: int = 1,
) -> Tensor:
    """PyTorch's transposed convolution of ``x`` (N, C_in, *L) with ``weight`` (C_in,
    C_out/groups, *k), plus ``bias`` (C_out,): the adjoint of :func:`conv`."""
    t, w, b, inputs = _operands(ad, "conv_transpose", x, weight, bias)
    ext, dims = extension_of(ad.xp), len(stride)
    spatial = _spatial(stride, padding, dilation, groups)
    extra = tuple(int(e) for e in output_padding) if output_padding else (0,) * dims
    xa, wa = t.array, w.array
    y = _with_bias(ad, ext.conv_transpose(xa, wa, **spatial, output_padding=extra), b, dims)

    def backward(g: Any) -> tuple[Any, ...]:
        # y is the adjoint of the convolution z -> conv(z, w) with the padding below, over the
        # part of g that depends on x: where output_padding reaches past the padding at the
        # end, y's last positions are zeros whatever x is.
        pads, keep = [], []
        for (lo, hi), e, length in zip(spatial["padding"], extra, g.shape[2:], strict=True):
            pads.append((lo, max(hi - e, 0)))
            keep.append(length - max(e - hi, 0))
        cropped = keep != list(g.shape[2:])
        seen = g[(slice(None), slice(None), *(slice(0, k) for k in keep))] if cropped else g
        adjoint = {**spatial, "padding": tuple(pads)}
        gx = ext.conv(seen, wa, **adjoint) if t.requires_grad else None
        gw = None
        if w.requires_grad:
            gw = ext.conv_weight_grad(seen, xa, kernel=tuple(wa.shape[2:]), **adjoint)
        return (gx, gw, *_bias_grad(ad, g, b))

    return record(ad, "conv_transpose", y, inputs, backward)


def _spatial(
    stride: Sequence[int], padding: Sequence[Pair], dilation: Sequence[int] | None, groups: int
) -> dict[str, Any]:
    dims = len(stride)
    return {
        "stride": tuple(int(s) for s in stride),
        "padding": tuple((int(lo), int(hi)) for lo, hi in padding),
        "dilation": (1,) * dims if dilation is None else tuple(int(d) for d in dilation),
        "groups": int(groups),
    }


def _transpose_extra(
    lengths: tuple[int, ...], out: tuple[int, ...], kernel: Sequence[int], spatial: dict[str, Any]
) -> tuple[int, ...]:
    """The ``output_padding`` that makes the transposed convolution of a gradient of length
    ``out`` come back to the input's ``lengths``: the positions at the end that the
    convolution's last window did not reach."""
    extra = []
    for m, o, k, s, (lo, hi), d in zip(
        lengths,
        out,
        kernel,
        spatial["stride"],
        spatial["padding"],
        spatial["dilation"],
        strict=True,
    ):
        extra.append(m - ((o - 1) * s + d * (int(k) - 1) + 1 - lo - hi))
    return tuple(extra)


def _pool(name: str, op: Any) -> Callable[..., Tensor]:
    def pool(
        ad: Autodiff,
        x: Any,
        /,
        *,
        kernel: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        count_include_pad: bool = True,
    ) -> Tensor:
        t = as_tensor(ad, x)
        ext, xa = extension_of(ad.xp), t.array
        window: dict[str, Any] = {
            "kernel": tuple(int(k) for k in kernel),
            "stride": tuple(int(s) for s in stride),
            "padding": tuple(int(p) for p in padding),
            "count_include_pad": bool(count_include_pad),
        }
        y = ext.pool(op, xa, **window)

        def backward(g: Any) -> tuple[Any]:
            return (ext.pool_backward(op, xa, g, **window),)

        return record(ad, name, y, (t,), backward)

    pool.__name__ = pool.__qualname__ = name
    pool.__doc__ = f"{op.capitalize()} pooling of ``x`` (N, C, *L) over windows of ``kernel``."
    return pool


max_pool = _pool("max_pool", "max")
avg_pool = _pool("avg_pool", "avg")

FUNCTIONS: dict[str, Callable[..., Tensor]] = {
    "conv": conv,
    "conv_transpose": conv_transpose,
    "max_pool": max_pool,
    "avg_pool": avg_pool,
}
