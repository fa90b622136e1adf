"""``MultiheadAttention``, with PyTorch's arguments, parameter names, layouts and
initialisation, so weights files interchange with PyTorch's: ``in_proj_weight`` (3E, E) (the
query, key and value projections stacked), ``in_proj_bias`` (3E,), ``out_proj.weight`` (E, E)
and ``out_proj.bias`` (E,).

As PyTorch's, ``in_proj_weight`` is drawn by ``xavier_uniform_``, the biases start at zero
and ``out_proj.weight`` is a ``Linear``'s. Its masks follow PyTorch's ``MultiheadAttention``,
the opposite of ``F.scaled_dot_product_attention`` for booleans: ``True`` in ``attn_mask`` or
``key_padding_mask`` means "do not attend"; a floating mask is added to the scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from client.autodiff import Autodiff, Tensor

from . import functional as F
from .functional import ArrayLike
from .functional.arguments import as_tensor, check_same_dtype, sizes
from .functional.attention import attend, causal_mask
from .functional.dropout import check_probability
from .init import DTypeLike, constant, resolve, uniform, xavier_bound
from .layers import Linear
from .module import Module


class MultiheadAttention(Module):
    """Attention from ``num_heads`` heads of ``embed_dim // num_heads`` each, their outputs
    concatenated and projected by ``out_proj``.

    Inputs are (L, N, E) by default, as PyTorch's; (N, L, E) with ``batch_first=True``; (L, E)
    for one sample. ``forward`` returns the output and, with ``need_weights``, the attention
    weights (after dropout, as PyTorch's), averaged over the heads unless
    ``average_attn_weights=False``. ``is_causal=True`` with no ``attn_mask`` masks the future
    (PyTorch insists on an ``attn_mask`` as well; given one, it is used as it is).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        *,
        ad: Autodiff | None = None,
        rng: np.random.Generator | None = None,
        dtype: DTypeLike = "float32",
    ) -> None:
        super().__init__()
        if embed_dim < 1 or num_heads < 1 or embed_dim % num_heads:
            raise ValueError(
                f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                f"({num_heads}), both positive"
            )
        check_probability("MultiheadAttention", dropout)
        if (
            add_bias_kv
            or add_zero_attn
            or kdim not in (None, embed_dim)
            or vdim
            not in (
                None,
                embed_dim,
            )
        ):
            raise ValueError(
                "MultiheadAttention: add_bias_kv, add_zero_attn and a kdim or vdim other than "
                "embed_dim are not supported"
            )
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first = float(dropout), batch_first
        ad, rng = resolve(ad, rng)
        # PyTorch's order of draws: out_proj's Linear first, then in_proj_weight's xavier
        out_proj = Linear(embed_dim, embed_dim, bias=bias, ad=ad, rng=rng, dtype=dtype)
        bound = xavier_bound(embed_dim, 3 * embed_dim)
        self.in_proj_weight = uniform(ad, (3 * embed_dim, embed_dim), bound, rng, dtype)
        self.in_proj_bias: Tensor | None = None
        if bias:
            self.in_proj_bias = constant(ad, (3 * embed_dim,), 0.0, dtype)
            out_proj.bias = constant(ad, (embed_dim,), 0.0, dtype)
        self.out_proj = out_proj

    def forward(
        self,
        query: ArrayLike,
        key: ArrayLike,
        value: ArrayLike,
        key_padding_mask: ArrayLike | None = None,
        need_weights: bool = True,
        attn_mask: ArrayLike | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        ad = self.in_proj_weight.namespace
        self_attention = query is key and key is value
        q, k, v = (as_tensor(ad, t) for t in (query, key, value))
        unbatched = q.ndim == 2
        q, k, v = (self._batch_first(t, unbatched) for t in (q, k, v))
        (n, length, _), source = sizes(q), sizes(k)[1]
        self._check(q, k, v)
        if self_attention:  # one projection for all three
            qkv = F.linear(q, self.in_proj_weight, self.in_proj_bias)
            q, k, v = (qkv[..., i * self.embed_dim : (i + 1) * self.embed_dim] for i in range(3))
        else:
            q, k, v = (self._project(t, i) for i, t in enumerate((q, k, v)))
        masks = self._masks(
            ad, (n, length, source), unbatched, key_padding_mask, attn_mask, is_causal
        )
        q, k, v = (self._heads(t) for t in (q, k, v))
        # PyTorch computes through scaled_dot_product_attention (a blocked row gives zeros)
        # only when it does not return the weights (a blocked row gives NaN)
        safe = not need_weights and (attn_mask is not None or key_padding_mask is not None)
        dropout = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, masks, dropout, safe=safe)
        out = ad.reshape(ad.permute_dims(out, (0, 2, 1, 3)), (n, length, self.embed_dim))
        out = self._restored(self.out_proj(out), unbatched)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = ad.mean(weights, axis=1)
        return out, (ad.squeeze(weights, axis=0) if unbatched else weights)

    def _batch_first(self, t: Tensor, unbatched: bool) -> Tensor:
        """``t`` as (N, L, E)."""
        if t.ndim != (2 if unbatched else 3):
            raise ValueError(
                f"MultiheadAttention: query, key and value must all be 3-D (batched) or 2-D "
                f"(one sample), got shape {t.shape}"
            )
        ad = t.namespace
        if unbatched:
            out: Tensor = ad.expand_dims(t, axis=0)
            return out
        return t if self.batch_first else ad.permute_dims(t, (1, 0, 2))

    def _restored(self, out: Tensor, unbatched: bool) -> Tensor:
        """``out`` (N, L, E) back in the inputs' layout."""
        ad = out.namespace
        if unbatched:
            squeezed: Tensor = ad.squeeze(out, axis=0)
            return squeezed
        return out if self.batch_first else ad.permute_dims(out, (1, 0, 2))

    def _check(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        e = self.embed_dim
        if q.shape[2] != e or k.shape[2] != e or v.shape[2] != e:
            raise ValueError(
                f"MultiheadAttention: query, key and value must have {e} features (embed_dim), "
                f"got shapes {q.shape}, {k.shape}, {v.shape} (as (N, L, E))"
            )
        if k.shape != v.shape or k.shape[0] != q.shape[0]:
            raise ValueError(
                f"MultiheadAttention: key {k.shape} and value {v.shape} must have one shape, and "
                f"the query's batch size {q.shape[0]} (as (N, L, E))"
            )
        check_same_dtype(
            "MultiheadAttention", q, key=k, value=v, in_proj_weight=self.in_proj_weight
        )

    def _project(self, t: Tensor, index: int) -> Tensor:
        """The query's (0), key's (1) or value's (2) projection of ``t``."""
        rows = slice(index * self.embed_dim, (index + 1) * self.embed_dim)
        bias = None if self.in_proj_bias is None else self.in_proj_bias[rows]
        return F.linear(t, self.in_proj_weight[rows], bias)

    def _heads(self, t: Tensor) -> Tensor:
        """(N, L, E) -> (N, heads, L, head_dim)."""
        ad = t.namespace
        split = ad.reshape(t, (t.shape[0], t.shape[1], self.num_heads, self.head_dim))
        out: Tensor = ad.permute_dims(split, (0, 2, 1, 3))
        return out

    def _masks(
        self,
        ad: Autodiff,
        scores: tuple[int, int, int],
        unbatched: bool,
        key_padding_mask: Any,
        attn_mask: Any,
        is_causal: bool,
    ) -> list[Tensor]:
        """The masks in ``attend``'s convention (True attends), shaped to broadcast against
        the scores (N, heads, L, S), whose N, L and S ``scores`` gives. One sample's
        key_padding_mask is (S,), as PyTorch's."""
        n, length, source = scores
        masks = []
        if attn_mask is not None:
            mask = as_tensor(ad, attn_mask)
            if mask.shape == (n * self.num_heads, length, source):
                mask = ad.reshape(mask, (n, self.num_heads, length, source))
            elif mask.shape != (length, source):
                raise ValueError(
                    f"MultiheadAttention: attn_mask must be (L, S) = {(length, source)} or "
                    f"(N * num_heads, L, S), got shape {mask.shape}"
                )
            masks.append(_attending(mask))
        elif is_causal:
            masks.append(causal_mask(ad, length, source))
        if key_padding_mask is not None:
            mask = as_tensor(ad, key_padding_mask)
            expected, layout = ((source,), "(S,)") if unbatched else ((n, source), "(N, S)")
            if mask.shape != expected:
                raise ValueError(
                    f"MultiheadAttention: key_padding_mask must be {layout} = {expected}, got "
                    f"shape {mask.shape}"
                )
            masks.append(_attending(ad.reshape(mask, (n, 1, 1, source))))
        return masks


def _attending(mask: Tensor) -> Tensor:
    """A PyTorch ``MultiheadAttention`` mask (boolean: True ignores) in ``attend``'s
    convention (boolean: True attends); a floating one as it is."""
    ad = mask.namespace
    if ad.xp.isdtype(mask.dtype, "bool"):
        flipped: Tensor = ad.logical_not(mask)
        return flipped
    return mask
