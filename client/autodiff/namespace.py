"""The autodiff namespace: the wrapped namespace's functions, differentiable where this package
knows a gradient, passed through (and refusing to be differentiated) where it does not.

Nothing here or below imports anything of ``client`` outside this package (pyproject.toml's
"training sits on the standard alone"); the wrapped namespace is called through the standard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from . import convolution, elementwise, indexing, linalg, normalization, reductions, shaping
from .extension import extension_of
from .tensor import Tensor, record

DIFFERENTIABLE: dict[str, Callable[..., Tensor]] = {
    **elementwise.FUNCTIONS,
    **reductions.FUNCTIONS,
    **shaping.FUNCTIONS,
    **indexing.FUNCTIONS,
    **linalg.FUNCTIONS,
    **convolution.FUNCTIONS,  # these and the next: Tensorwire's extension, not the standard's
    **normalization.FUNCTIONS,
}

_SUBNAMESPACES = ("linalg", "fft")
_RANDOM_DTYPES: dict[str, Literal["float32", "float64"]] = {
    "float32": "float32",
    "float64": "float64",
}


class Autodiff:
    """Reverse-mode autodiff over any Array API namespace ``xp`` (Burn's ``Autodiff<B>``).

    ::

        ad = Autodiff(client.namespace(dev))   # or Autodiff(numpy)
        w = ad.asarray(w0, requires_grad=True)
        loss = ad.mean((x @ w - y) ** 2)
        loss.backward()                        # w.grad: computed where w lives

    Every function of ``xp`` is here with the same signature, taking and returning
    :class:`Tensor`. Those listed in ``DIFFERENTIABLE`` record their gradient; the others run
    as they are and their float outputs refuse differentiation (``NoGradientError``, naming
    the function). Data types and constants are ``xp``'s own.
    """

    # The functions behind the tensor's operators and properties, typed as giving tensors (set
    # from DIFFERENTIABLE below; the rest are typed by __getattr__).
    add: Callable[..., Tensor]
    subtract: Callable[..., Tensor]
    multiply: Callable[..., Tensor]
    divide: Callable[..., Tensor]
    floor_divide: Callable[..., Tensor]
    remainder: Callable[..., Tensor]
    pow: Callable[..., Tensor]
    matmul: Callable[..., Tensor]
    negative: Callable[..., Tensor]
    positive: Callable[..., Tensor]
    abs: Callable[..., Tensor]
    getitem: Callable[..., Tensor]
    permute_dims: Callable[..., Tensor]
    matrix_transpose: Callable[..., Tensor]
    less: Callable[..., Tensor]  # these pass through: their outputs carry no gradient
    less_equal: Callable[..., Tensor]
    greater: Callable[..., Tensor]
    greater_equal: Callable[..., Tensor]
    equal: Callable[..., Tensor]
    not_equal: Callable[..., Tensor]
    bitwise_and: Callable[..., Tensor]
    bitwise_or: Callable[..., Tensor]
    bitwise_xor: Callable[..., Tensor]
    bitwise_invert: Callable[..., Tensor]

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self._real_floating: dict[Any, bool] = {}

    def __repr__(self) -> str:
        return f"Autodiff({getattr(self.xp, '__name__', self.xp)!r})"

    @property
    def __array_api_version__(self) -> str:  # noqa: PLW3201 - the standard's attribute
        return str(self.xp.__array_api_version__)

    def is_real_floating(self, array: Any) -> bool:
        dtype = array.dtype
        known = self._real_floating.get(dtype)
        if known is None:
            known = self._real_floating[dtype] = bool(self.xp.isdtype(dtype, "real floating"))
        return known

    def asarray(
        self,
        obj: Any,
        /,
        *,
        dtype: Any = None,
        device: Any = None,
        copy: bool | None = None,
        requires_grad: bool = False,
    ) -> Tensor:
        """The standard's ``asarray``, as a tensor; a tensor given is read through its array."""
        if isinstance(obj, Tensor):
            obj = obj.array
        kwargs = {
            k: v for k, v in (("dtype", dtype), ("device", device), ("copy", copy)) if v is not None
        }
        return Tensor(self, self.xp.asarray(obj, **kwargs), requires_grad=requires_grad)

    def random_uniform(self, state: Any, shape: tuple[int, ...], dtype: Any) -> Tensor:
        """Numbers uniform on [0, 1) drawn on the device from the generator state ``state``
        (a uint64 array ``[seed, offset]``, which the caller advances): a constant."""
        return self._random("uniform", state, shape, dtype)

    def random_normal(self, state: Any, shape: tuple[int, ...], dtype: Any) -> Tensor:
        """Standard normal numbers drawn as :meth:`random_uniform` draws."""
        return self._random("normal", state, shape, dtype)

    def _random(self, op: Any, state: Any, shape: tuple[int, ...], dtype: Any) -> Tensor:
        if isinstance(state, Tensor):
            state = state.array
        name = str(getattr(dtype, "name", dtype))
        if name not in _RANDOM_DTYPES:
            raise TypeError(f"random numbers are float32 or float64, not {name}")
        ext = extension_of(self.xp)
        drawn = ext.random(state, op=op, shape=tuple(shape), dtype=_RANDOM_DTYPES[name])
        return Tensor(self, drawn)

    def tensor(self, array: Any, /, *, requires_grad: bool = False) -> Tensor:
        """An array of the wrapped namespace as a tensor, without a copy."""
        return Tensor(self, array, requires_grad=requires_grad)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = getattr(self.xp, name)
        if name in _SUBNAMESPACES:
            wrapped: Any = _Subnamespace(self, name, target)
        elif callable(target) and not isinstance(target, type):
            wrapped = _passed_through(self, name, target)
        else:
            return target  # data types, constants
        setattr(self, name, wrapped)  # once per name and namespace
        return wrapped


for _name, _function in DIFFERENTIABLE.items():
    setattr(Autodiff, _name, _function)


class _Subnamespace:
    """``ad.linalg`` and ``ad.fft``: their functions passed through, except those this package
    differentiates (``ad.linalg.matmul`` is ``ad.matmul``)."""

    def __init__(self, ad: Autodiff, name: str, target: Any) -> None:
        self._ad, self._name, self._target = ad, name, target

    def __getattr__(self, name: str) -> Any:
        if name in DIFFERENTIABLE:
            return getattr(self._ad, name)
        return _passed_through(self._ad, f"{self._name}.{name}", getattr(self._target, name))


# Functions whose result depends on the shape and dtype of their tensor arguments, not on
# their values: constants, never a node that would refuse differentiation.
_VALUE_FREE = frozenset({"zeros_like", "ones_like", "full_like", "empty_like"})


def _passed_through(ad: Autodiff, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` over tensors' arrays; its array results as tensors that carry no gradient
    (and refuse to be differentiated when an input required one)."""
    value_free = name in _VALUE_FREE

    def passed_through(*args: Any, **kwargs: Any) -> Any:
        inputs: list[Tensor] = []
        result = function(
            *_arrays(args, inputs), **{k: _arrays(v, inputs) for k, v in kwargs.items()}
        )
        return _tensors(ad, name, result, () if value_free else tuple(inputs))

    passed_through.__name__ = passed_through.__qualname__ = name.rsplit(".", 1)[-1]
    return passed_through


def _arrays(value: Any, found: list[Tensor]) -> Any:
    """``value`` with every tensor in it (at any depth of lists and tuples) replaced by its
    array; the tensors are added to ``found``."""
    if isinstance(value, Tensor):
        found.append(value)
        return value.array
    if isinstance(value, list | tuple):
        return type(value)(_arrays(v, found) for v in value)
    return value


def _tensors(ad: Autodiff, name: str, result: Any, inputs: tuple[Tensor, ...]) -> Any:
    if hasattr(result, "__array_namespace__"):
        return record(ad, name, result, inputs, None)
    if isinstance(result, tuple) and hasattr(result, "_fields"):  # a named tuple (unique_all)
        return type(result)(*(_tensors(ad, name, r, inputs) for r in result))
    if isinstance(result, list | tuple):
        return type(result)(_tensors(ad, name, r, inputs) for r in result)
    return result
