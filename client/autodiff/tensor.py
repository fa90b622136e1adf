"""The differentiable tensor: an array of the wrapped namespace, whether it requires a gradient,
its accumulated ``.grad``, and the node that made it.

Every operator dispatches through the tensor's namespace (``self._ad``, an
:class:`~client.autodiff.namespace.Autodiff`), so this module imports no op: the ops import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .._array_methods import ArrayMethods
from .._printing import array_repr, array_str, printing_values
from .backward import run_backward
from .errors import AutodiffError, NotDifferentiableError
from .mode import is_grad_enabled
from .node import Backward, Node

if TYPE_CHECKING:
    from .namespace import Autodiff


# --- the operators, from factories (each is a plain method to Python and to mypy) -------------

Operator = Callable[["Tensor", Any], "Tensor"]


def _unary_operator(name: str) -> Callable[[Tensor], Tensor]:
    def unary_operator(self: Tensor) -> Tensor:
        function: Callable[[Tensor], Tensor] = getattr(self._ad, name)
        return function(self)

    unary_operator.__doc__ = f"The namespace's ``{name}`` of this tensor."
    return unary_operator


def _binary_operator(name: str, reflected: bool = False) -> Operator:
    def binary_operator(self: Tensor, other: Any) -> Tensor:
        function: Callable[[Any, Any], Tensor] = getattr(self._ad, name)
        return function(other, self) if reflected else function(self, other)

    order = "``other`` and this tensor" if reflected else "this tensor and ``other``"
    binary_operator.__doc__ = f"The namespace's ``{name}`` of {order}."
    return binary_operator


def _binary_operators(name: str) -> tuple[Operator, Operator]:
    """The operator for ``name`` and its reflected form."""
    return _binary_operator(name), _binary_operator(name, reflected=True)


def _in_place_operator(method: str) -> Operator:
    def in_place_operator(self: Tensor, other: Any) -> Tensor:
        return self._in_place(method, other)

    in_place_operator.__doc__ = f"``{method}`` of the array, where no gradient can be corrupted."
    return in_place_operator


class Tensor(ArrayMethods):
    """An array of the wrapped namespace that records how it was made.

    ``array`` is the wrapped namespace's array (a ``RemoteArray`` on a remote device, a numpy
    array locally); reading it costs what reading that array costs. Operators work as the
    standard's do, with Python scalars and plain arrays of the same device as constants;
    numpy's methods (``t.sum()``, ``client._array_methods``) record gradients as they do.
    """

    __slots__ = (
        "array",
        "_ad",
        "_requires_grad",
        "_grad",
        "_node",
        "_counter",
        "_retains_grad",
        "_shared",
        "__weakref__",
    )
    __array_ufunc__ = None  # numpy defers to our reflected operators: ndarray + Tensor records

    def __init__(
        self,
        ad: Autodiff,
        array: Any,
        requires_grad: bool = False,
        counter: list[int] | None = None,
    ) -> None:
        self.array = array
        self._ad = ad
        self._requires_grad = False
        self._grad: Tensor | None = None
        self._node: Node | None = None
        # The version: bumped by every in-place change, checked by the nodes that saw it; one
        # counter shared by every tensor over the same memory (a view, a detach()), as
        # PyTorch's, so that a write through one is seen by the nodes that saved another.
        self._counter = [0] if counter is None else counter
        self._retains_grad = False
        self._shared = False  # the array may be another tensor's too: copied before a write
        if requires_grad:
            self.requires_grad = True

    @property
    def _version(self) -> int:
        return self._counter[0]

    @_version.setter
    def _version(self, value: int) -> None:
        self._counter[0] = value

    # --- what it is -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int | None, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> Any:
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return int(self.array.ndim)

    @property
    def size(self) -> int | None:
        return self.array.size  # type: ignore[no-any-return]

    @property
    def device(self) -> Any:
        return self.array.device

    @property
    def namespace(self) -> Autodiff:
        """The autodiff namespace this tensor's ops run in."""
        return self._ad

    @property
    def T(self) -> Tensor:  # noqa: N802 - the standard's name
        return self._ad.permute_dims(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> Tensor:  # noqa: N802 - the standard's name
        return self._ad.matrix_transpose(self)

    def __repr__(self) -> str:
        """The values as numpy's repr writes them (one read of the array, ``client._printing``),
        with the dtype, device and how it was made; while printing values is off, or once its
        device is closed or lost, the shape instead of the values."""
        made = f", op={self._node.name}" if self._node is not None else ""
        grad = ", requires_grad=True" if self._requires_grad else ""
        extras = f"dtype={self.dtype}, device={self.device!r}{grad}{made}"
        if printing_values():
            try:
                return array_repr(self.array, "Tensor", extras)
            except ConnectionError:  # its device is closed or lost: no values to show
                pass
        return f"Tensor(shape={self.shape}, {extras})"

    def __str__(self) -> str:
        """The values as numpy's str writes them (one read), or, without values, the repr."""
        return array_str(self.array) if printing_values() else repr(self)

    # --- differentiation ----------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if self._node is not None:
            raise AutodiffError(
                f"requires_grad of a tensor made by {self._node.name} follows its inputs; "
                "detach() it to get a leaf"
            )
        if value and not self._ad.is_real_floating(self.array):
            raise NotDifferentiableError(
                f"only real floating-point tensors can require gradients, not {self.dtype}"
            )
        self._requires_grad = bool(value)

    def requires_grad_(self, value: bool = True) -> Tensor:
        self.requires_grad = value
        return self

    @property
    def is_leaf(self) -> bool:
        """Made by the user, not by a recorded op: backward() fills its ``.grad``."""
        return self._node is None

    @property
    def op(self) -> str | None:
        """The name of the recorded op that made it, None for a leaf."""
        return None if self._node is None else self._node.name

    @property
    def grad(self) -> Tensor | None:
        """The accumulated gradient (None until a backward() reaches this tensor)."""
        if not self._requires_grad:
            raise NotDifferentiableError(
                "this tensor does not require grad, so it has no .grad; create it with "
                "requires_grad=True (or call requires_grad_()) before computing with it"
            )
        if self._node is not None and not self._retains_grad:
            raise NotDifferentiableError(
                f"the tensor made by {self._node.name} is not a leaf: its gradient is not kept "
                "unless retain_grad() is called before backward()"
            )
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None and not isinstance(value, Tensor):
            value = Tensor(self._ad, value)  # an array of the wrapped namespace
        if value is not None and value.shape != self.shape:
            raise NotDifferentiableError(
                f".grad of shape {value.shape} for a tensor of {self.shape}"
            )
        self._grad = value

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` during backward()."""
        if not self._requires_grad:
            raise NotDifferentiableError("retain_grad() of a tensor that does not require grad")
        self._retains_grad = True

    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Accumulate the gradient of this tensor into every leaf it depends on.

        ``grad`` is the gradient of some scalar with respect to this tensor (same shape); it
        may be omitted for a one-element tensor, where it is 1. The graph is freed afterwards
        unless ``retain_graph``.
        """
        if not self._requires_grad:
            raise NotDifferentiableError(
                "backward() of a tensor that does not require grad: none of its inputs "
                "required grad, or it was computed inside no_grad()"
            )
        if grad is None:
            if self.size != 1:
                raise NotDifferentiableError(
                    f"backward() of a non-scalar output of shape {self.shape} needs an output "
                    "gradient: pass grad= (an array of that shape), or reduce it first"
                )
            grad = self._ad.xp.ones_like(self.array)
        elif isinstance(grad, Tensor):
            grad = grad.array
        if tuple(grad.shape) != self.shape:
            raise NotDifferentiableError(
                f"the output gradient has shape {tuple(grad.shape)}, the output {self.shape}"
            )
        run_backward(self, grad, retain_graph)

    def _accumulate(self, grad: Any) -> None:
        """Add ``grad`` to ``.grad`` (backward() calls this; gradients add up like PyTorch's).

        The first gradient is kept as it came, without a copy: it may be another leaf's too,
        or a read-only broadcast view, so the ``.grad`` tensor copies it before its first
        in-place change (copy on write: an optimizer that only reads gradients pays nothing).
        """
        if tuple(grad.shape) != self.shape:  # a bug in some op's gradient, not the user's
            raise AutodiffError(f"internal: gradient of shape {grad.shape} for {self.shape}")
        if self._grad is None:
            self._grad = Tensor(self._ad, grad)
            self._grad._shared = True
        else:
            self._grad = Tensor(self._ad, self._grad.array + grad)

    def detach(self) -> Tensor:
        """The same array, cut from the graph: no gradient flows through it. It shares this
        tensor's version, so an in-place change through it is caught like one through this."""
        out = Tensor(self._ad, self.array, counter=self._counter)
        out._shared = self._shared
        return out

    # --- reading --------------------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        """The values (one read of a remote array), as numpy asks for them."""
        values = np.asarray(self.array, dtype=dtype)
        return values.copy() if copy and values is self.array else values

    def __float__(self) -> float:
        return float(self.array)

    def __int__(self) -> int:
        return int(self.array)

    def __bool__(self) -> bool:
        return bool(self.array)

    def __index__(self) -> int:
        return int(self.array.__index__())

    def __len__(self) -> int:
        return len(self.array)

    def __iter__(self) -> Iterator[Tensor]:
        if not self.shape:  # at iter(), not at the first next(): np.iterable asks so
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0] or 0))

    def __array_namespace__(self, *, api_version: str | None = None) -> Autodiff:
        return self._ad

    # --- operators, from the table (each one is the namespace's function of the same meaning)
    __neg__ = _unary_operator("negative")
    __pos__ = _unary_operator("positive")
    __abs__ = _unary_operator("abs")
    __invert__ = _unary_operator("bitwise_invert")

    __add__, __radd__ = _binary_operators("add")
    __sub__, __rsub__ = _binary_operators("subtract")
    __mul__, __rmul__ = _binary_operators("multiply")
    __truediv__, __rtruediv__ = _binary_operators("divide")
    __floordiv__, __rfloordiv__ = _binary_operators("floor_divide")
    __mod__, __rmod__ = _binary_operators("remainder")
    __pow__, __rpow__ = _binary_operators("pow")
    __matmul__, __rmatmul__ = _binary_operators("matmul")
    # bitwise, as the standard's operators are (on booleans that is logical)
    __and__, __rand__ = _binary_operators("bitwise_and")
    __or__, __ror__ = _binary_operators("bitwise_or")
    __xor__, __rxor__ = _binary_operators("bitwise_xor")

    __lt__ = _binary_operator("less")
    __le__ = _binary_operator("less_equal")
    __gt__ = _binary_operator("greater")
    __ge__ = _binary_operator("greater_equal")
    __eq__ = _binary_operator("equal")  # type: ignore[assignment]
    __ne__ = _binary_operator("not_equal")  # type: ignore[assignment]
    __hash__ = object.__hash__  # by identity, as PyTorch's; __eq__ is element-wise

    def __getitem__(self, key: Any) -> Tensor:
        return self._ad.getitem(self, key)

    # --- in place: allowed where no gradient can be corrupted by it -------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        self._check_in_place("__setitem__", value)
        self.array[_plain(key)] = _plain(value)
        self._version += 1

    def _in_place(self, method: str, other: Any) -> Tensor:
        self._check_in_place(method, other)
        self.array = getattr(self.array, method)(_plain(other))
        self._version += 1
        return self

    def _check_in_place(self, method: str, value: Any) -> None:
        """Refuse a change that differentiation would not see; copy a shared array first."""
        if is_grad_enabled() and (
            self._requires_grad or (isinstance(value, Tensor) and value._requires_grad)
        ):
            raise AutodiffError(
                f"{method} with a tensor that requires grad, outside no_grad(): in-place "
                "changes are not recorded, so no gradient would flow through it; compute a "
                "new tensor instead, or update parameters inside no_grad()"
            )
        if self._shared:  # a gradient another tensor may hold too (copy on write)
            self.array = self._ad.xp.asarray(self.array, copy=True)
            self._shared = False

    __iadd__ = _in_place_operator("__iadd__")
    __isub__ = _in_place_operator("__isub__")
    __imul__ = _in_place_operator("__imul__")
    __itruediv__ = _in_place_operator("__itruediv__")


def _plain(value: Any) -> Any:
    """A tensor's array; anything else (scalars, plain arrays, index keys) as it is."""
    if isinstance(value, Tensor):
        return value.array
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def record(
    ad: Autodiff,
    name: str,
    array: Any,
    inputs: tuple[Tensor, ...],
    backward: Backward | None,
    *,
    view_of: Tensor | None = None,
    watched: tuple[Tensor, ...] = (),
) -> Tensor:
    """The output of op ``name``: recorded with its inputs and ``backward`` when gradients are
    on, some input requires one and the output is real floating point; else a constant.

    ``view_of``: the output may share that input's memory (a view), so it shares its version.
    ``watched``: tensors the backward reads that are not inputs (``where``'s condition), whose
    in-place changes it must notice too.
    """
    out = Tensor(ad, array, counter=None if view_of is None else view_of._counter)
    if is_grad_enabled() and any(t._requires_grad for t in inputs) and ad.is_real_floating(array):
        out._requires_grad = True
        out._node = Node(name, inputs, backward, out._version, watched)
    return out
