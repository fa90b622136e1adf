"""Tensorwire's neural-network extension, as autodiff reaches it: the ops the Array API
standard lacks (convolutions, pooling, batch normalization, softmax, random numbers drawn on
the device, and Adam's per-parameter chains as one op each, for ``client.optim``), called on
arrays of the namespace being wrapped.

A namespace offers the extension as its attribute ``__tensorwire_nn__`` (Tensorwire's remote
namespaces do: each function is one protocol op); another namespace can be given one with
:func:`register` (``import client`` registers numpy's, which runs the server's own numpy code
in this process, so local results are the server's). The functions take and return arrays of
that namespace, never tensors: the differentiable functions over them are in
``convolution``/``normalization`` (this package) and the layers in ``client.nn``.

Every function takes its spatial parameters per spatial dimension (``len(stride)`` of them)
and its padding as ``(before, after)`` pairs; ``protocol/ops/nn.py`` defines each op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

Pair = tuple[int, int]
PoolName = Literal["max", "avg"]


class Extension(Protocol):
    """The extension's functions over one namespace's arrays."""

    def conv(
        self,
        x: Any,
        weight: Any,
        *,
        stride: Sequence[int],
        padding: Sequence[Pair],
        dilation: Sequence[int],
        groups: int,
    ) -> Any: ...

    def conv_transpose(
        self,
        x: Any,
        weight: Any,
        *,
        stride: Sequence[int],
        padding: Sequence[Pair],
        dilation: Sequence[int],
        groups: int,
        output_padding: Sequence[int],
    ) -> Any: ...

    def conv_weight_grad(
        self,
        x: Any,
        grad: Any,
        *,
        kernel: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[Pair],
        dilation: Sequence[int],
        groups: int,
    ) -> Any: ...

    def pool(
        self,
        op: PoolName,
        x: Any,
        *,
        kernel: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        count_include_pad: bool = True,
    ) -> Any: ...

    def pool_backward(
        self,
        op: PoolName,
        x: Any,
        grad: Any,
        *,
        kernel: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        count_include_pad: bool = True,
    ) -> Any: ...

    def batch_norm(
        self, x: Any, mean: Any, var: Any, weight: Any | None, bias: Any | None, *, eps: float
    ) -> Any: ...

    def softmax(self, op: Literal["softmax", "log_softmax"], x: Any, *, axis: int) -> Any: ...

    def random(
        self,
        state: Any,
        *,
        op: Literal["uniform", "normal"],
        shape: Sequence[int],
        dtype: Literal["float32", "float64"],
    ) -> Any: ...

    # Adam's per-parameter chains, one op each (protocol/ops/optim.py): the bits of the chain

    def has_optimizer_ops(self) -> bool:
        """Whether the two functions below are one op each here (a server that predates
        them does not speak them: the optimizer then sends their element-wise ops)."""
        ...

    def moment_update(
        self, moment: Any, grad: Any, *, decay: float, scale: float, squared: bool
    ) -> Any:
        """``moment *= decay; moment += scale * grad`` (``squared``: ``* grad`` once more), in
        place; the moment (a copy of it where it could not be written)."""
        ...

    def adam_direction(self, exp_avg: Any, exp_avg_sq: Any, step_size: Any, eps_term: Any) -> Any:
        """``(step_size * exp_avg) / (sqrt(exp_avg_sq) + eps_term)``, a new array."""
        ...


_REGISTERED: dict[int, tuple[Any, Extension]] = {}


def register(xp: Any, extension: Extension) -> None:
    """Make ``extension`` the one of namespace ``xp`` (a module, such as numpy), which cannot
    carry the attribute itself."""
    _REGISTERED[id(xp)] = (xp, extension)


def find_extension(xp: Any) -> Extension | None:
    """The extension of namespace ``xp``, or None where it has none."""
    found: Extension | None = getattr(xp, "__tensorwire_nn__", None)
    if found is not None:
        return found
    registered = _REGISTERED.get(id(xp))
    return None if registered is None else registered[1]


def extension_of(xp: Any) -> Extension:
    """The extension of namespace ``xp``.

    Raises:
        TypeError: ``xp`` has none (array_api_strict, for example): these ops are Tensorwire's
            own, not the standard's.
    """
    found = find_extension(xp)
    if found is not None:
        return found
    name = getattr(xp, "__name__", repr(xp))
    raise TypeError(
        f"{name} has no convolution, pooling or device random numbers: they are Tensorwire's "
        "own extension, on a Tensorwire namespace (client.namespace(dev)) or numpy"
    )
