"""What the functions' arguments become: tensors of one autodiff namespace, and PyTorch's
"an int, or one per spatial dimension" arguments as tuples, checked with messages that name
the function and the argument."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from client.autodiff import Autodiff, Tensor

from ..init import local_autodiff

ArrayLike = Any  # a Tensor, an array of any Array API namespace, or a nested list


def namespace_of(*values: ArrayLike) -> Autodiff:
    """The autodiff namespace of the first tensor among ``values``; with none, one over the
    first array's own namespace (numpy's is the shared local one)."""
    for value in values:
        if isinstance(value, Tensor):
            return value.namespace
    for value in values:
        if hasattr(value, "__array_namespace__"):
            xp = value.__array_namespace__()
            local = local_autodiff()
            return local if xp is local.xp else Autodiff(xp)
    return local_autodiff()


def as_tensor(ad: Autodiff, value: ArrayLike) -> Tensor:
    """``value`` as a tensor of ``ad``: a tensor as it is, anything else through ``asarray``
    (no copy for an array already of ``ad``'s namespace, an upload for a numpy array given to
    a remote one)."""
    return value if isinstance(value, Tensor) else ad.asarray(value)


def sizes(t: Tensor) -> tuple[int, ...]:
    """``t``'s shape as ints. Only an op whose output size depends on values (``unique``)
    leaves a size unknown; such a tensor is refused here rather than mis-sized."""
    known = tuple(n for n in t.shape if n is not None)
    if len(known) != t.ndim:
        raise ValueError(f"an input's shape {t.shape} is not known; read its size first")
    return known


def per_dimension(
    function: str, argument: str, value: int | Sequence[int], dims: int, minimum: int = 1
) -> tuple[int, ...]:
    """``value`` (an int, or ``dims`` ints) as ``dims`` ints, each at least ``minimum``."""
    values: tuple[Any, ...] = ()
    if _is_int(value):
        values = (value,) * dims
    elif isinstance(value, Sequence) and not isinstance(value, str):
        values = tuple(value)
    if len(values) != dims or not all(_is_int(v) for v in values):
        raise ValueError(f"{function}: {argument} must be an int or {dims} ints, not {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{function}: {argument} must be at least {minimum}, not {value!r}")
    return tuple(int(v) for v in values)


def _is_int(value: Any) -> bool:
    """An int or an integer scalar (numpy's), not a bool."""
    return not isinstance(value, bool) and (isinstance(value, int) or hasattr(value, "__index__"))


def check_groups(function: str, groups: int) -> int:
    if not _is_int(groups) or int(groups) < 1:
        raise ValueError(f"{function}: groups must be a positive int, not {groups!r}")
    return int(groups)


_LAYOUTS = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


def batched(function: str, x: Tensor, dims: int) -> tuple[Tensor, bool]:
    """``x`` as ``(N, C, *spatial)`` with ``dims`` spatial axes, and whether it came without
    its batch axis (PyTorch takes such an input as one sample); refused if it has another
    number of axes or is not floating."""
    layout = _LAYOUTS[dims]
    if x.ndim not in (dims + 1, dims + 2):
        raise ValueError(
            f"{function}: expected a {dims + 2}-D input {layout} (or {dims + 1}-D without N), "
            f"got an input of shape {x.shape}"
        )
    if not x.namespace.is_real_floating(x.array):
        raise TypeError(f"{function}: the input must be float32 or float64, not {x.dtype}")
    if x.ndim == dims + 1:
        return x.namespace.expand_dims(x, axis=0), True
    return x, False


def unbatched(y: Tensor, was_unbatched: bool) -> Tensor:
    """``y`` without the batch axis :func:`batched` added."""
    out: Tensor = y.namespace.squeeze(y, axis=0) if was_unbatched else y
    return out


def check_same_dtype(function: str, x: Tensor, **others: Tensor | None) -> None:
    """Refuse ``others`` (weight, bias, statistics) of another dtype than the input's: the
    ops compute in one floating dtype, and a silent cast would hide a float64 model fed
    float32 data."""
    for name, value in others.items():
        if value is not None and value.dtype != x.dtype:
            raise TypeError(
                f"{function}: {name} is {value.dtype} but the input is {x.dtype}; "
                "cast one (astype) so that they match"
            )


def check_vector(function: str, name: str, value: Tensor | None, length: int) -> None:
    """Refuse a per-channel ``value`` (bias, weight, statistics) that is not of shape
    ``(length,)``."""
    if value is not None and tuple(value.shape) != (length,):
        raise ValueError(
            f"{function}: {name} must have shape ({length},), got shape {tuple(value.shape)}"
        )


def optional_tensor(ad: Autodiff, value: ArrayLike | None) -> Tensor | None:
    return None if value is None else as_tensor(ad, value)
