"""``dropout``: zero each element with probability ``p`` and scale the rest by ``1/(1-p)``,
with the mask drawn on the device by its generator (``client.nn.random``)."""

from __future__ import annotations

from client.autodiff import Tensor

from ..random import device_generator
from .arguments import ArrayLike, as_tensor, namespace_of, sizes


def check_probability(owner: str, p: float, inplace: bool = False) -> None:
    """Refuse a dropout probability outside [0, 1], and ``inplace=True``."""
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{owner}: the probability p must be between 0 and 1, not {p!r}")
    if inplace:
        raise ValueError(f"{owner}: inplace=True is not supported; use the returned tensor")


def dropout(
    input: ArrayLike, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """``input`` with each element zeroed with probability ``p``, the others scaled by
    ``1/(1-p)`` so the expected value is unchanged (PyTorch's ``F.dropout``); ``input`` as it
    is when not ``training`` or ``p == 0``, zeros when ``p == 1``.

    The mask is ``uniform >= p`` over numbers drawn on the input's device, so it never
    crosses the wire, and the same seed (:func:`client.nn.manual_seed`) gives the same mask
    on a server, on the ``ndarray`` device and on numpy.
    """
    check_probability("dropout", p, inplace)
    ad = namespace_of(input)
    x = as_tensor(ad, input)
    if not training or p == 0.0:
        return x
    if not ad.is_real_floating(x.array):
        raise TypeError(f"dropout: the input must be float32 or float64, not {x.dtype}")
    if p == 1.0:
        zeros: Tensor = x * 0.0
        return zeros
    uniform = device_generator(ad).draw(ad, "uniform", sizes(x), x.dtype)
    kept = ad.astype(uniform >= p, x.dtype) * (1.0 / (1.0 - p))  # a constant: no gradient
    out: Tensor = x * kept
    return out
