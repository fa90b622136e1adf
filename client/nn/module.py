"""``Module``: the container of parameters and submodules every layer and model derives from,
with PyTorch's names (``parameters()``, ``named_parameters()``, ``train()``/``eval()``,
``state_dict()``/``load_state_dict()``), over tensors of any autodiff namespace.

Registration is by assignment, as in PyTorch: in ``__init__``, ``self.fc = Linear(...)``
registers a submodule and ``self.scale = ad.asarray(..., requires_grad=True)`` a parameter,
in the order assigned. A parameter is a leaf tensor that requires grad; any other value (a
constant tensor, a number) is a plain attribute that no optimizer or weights file sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Self

import numpy as np

from client.autodiff import Autodiff, Tensor

from . import weights


class StateDictError(ValueError):
    """A state dict does not fit a module: a name missing, a name the module lacks, or a
    shape that differs. The message names the first such mismatch."""


def _forward_unimplemented(self: Module, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        f"{type(self).__name__} defines no forward(); a Module subclass "
        "computes its output in forward(self, ...)"
    )


class Module:
    """A model or a layer: parameters and submodules held as attributes, ``forward`` the
    computation, ``module(x)`` the call of it.

    ::

        class MLP(nn.Module):
            def __init__(self, ad):
                super().__init__()
                self.fc1 = nn.Linear(4, 16, ad=ad)
                self.fc2 = nn.Linear(16, 1, ad=ad)

            def forward(self, x):
                return self.fc2(nn.relu(self.fc1(x)))
    """

    _parameters: dict[str, Tensor]
    _modules: dict[str, Module]
    training: bool
    # An attribute, not a method, as PyTorch's: subclasses define forward with their own
    # signature, which a method here would make an incompatible override for mypy.
    forward: Callable[..., Any] = _forward_unimplemented

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    # --- registration -------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() ran: call "
                f"super().__init__() first in {type(self).__name__}.__init__"
            )
        params, modules = self._parameters, self._modules
        if name in params and isinstance(value, Tensor) and not value.is_leaf:
            raise TypeError(  # as PyTorch's: it would silently stop being trained
                f"cannot assign the result of {value.op} to parameter {name!r} of "
                f"{type(self).__name__}: assign a leaf tensor (requires_grad=True), or None, "
                "or update it in place inside no_grad()"
            )
        # Assigning to a registered name keeps its place (dict order), as PyTorch's does; a
        # leaf that does not require grad stays a (frozen) parameter there.
        if isinstance(value, Tensor) and value.is_leaf and (value.requires_grad or name in params):
            modules.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            modules[name] = value
        else:
            params.pop(name, None)
            modules.pop(name, None)
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Reached only for a name never set (registered values are plain attributes too). It
        # says which module lacks it, and, as PyTorch's, lets a type checker accept
        # ``model[0].weight`` and attributes set in a subclass it cannot see.
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # --- what it holds ------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every submodule below it, each once, parents before children,
        with dotted names (``""`` for this one)."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            below = [
                (f"{name}.{key}" if name else key, child) for key, child in module._modules.items()
            ]
            stack.extend(reversed(below))  # popped in assignment order

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct submodules, each once, in assignment order."""
        seen: set[int] = set()
        for name, child in self._modules.items():
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator[Module]:
        for _, child in self.named_children():
            yield child

    def named_parameters(
        self,
        prefix: str = "",
        recurse: bool = True,
    ) -> Iterator[tuple[str, Tensor]]:
        """Every parameter once (a shared one under its first name), with dotted names:
        ``"fc1.bias"``, ``"0.weight"`` inside a ``Sequential``; a module's own parameters
        before its submodules', as PyTorch orders them."""
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for module_name, module in modules:
            for name, param in module._parameters.items():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield (f"{module_name}.{name}" if module_name else name), param

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        """Every parameter once: what an optimizer is given."""
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    @property
    def namespace(self) -> Autodiff:
        """The autodiff namespace the parameters live in (that of the first one)."""
        for param in self.parameters():
            return param.namespace
        raise ValueError(f"{type(self).__name__} has no parameters, so no namespace")

    # --- modes and gradients ------------------------------------------------------------------
    def train(self, mode: bool = True) -> Self:
        """Set ``training`` on this module and every submodule (layers that behave differently
        when evaluating read it); returns the module."""
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Self:
        """``train(False)``."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (``.grad = None``): the next backward() starts
        afresh instead of adding to it, and the server can free the old gradients."""
        for param in self.parameters():
            param.grad = None

    # --- values -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The parameters' arrays by dotted name, in ``named_parameters()`` order: the wrapped
        namespace's arrays themselves (no copy, nothing read from a remote device)."""
        return {name: param.array for name, param in self.named_parameters()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy ``state``'s values (numpy arrays, arrays of any namespace, tensors) into the
        parameters, on the device each parameter is on, cast to its dtype.

        The names must match exactly and every shape must fit; nothing is copied otherwise.
        As PyTorch's, the values are written into the parameters' own arrays in place, so an
        optimizer built on the parameters, and a step recorded by ``client.capture.jit`` that
        reads their arrays, see the loaded values. A parameter whose array cannot take them
        in place (a read-only numpy array) gets a new array of its own instead.

        Raises:
            StateDictError: naming the first mismatch: a missing name, then an unexpected
                one, then a shape that differs.
        """
        own = dict(self.named_parameters())
        _check_fits(type(self).__name__, own, state)
        ready = [(param, _on_device_of(param, state[name])) for name, param in own.items()]
        for param, value in ready:  # only once every value is ready: all or nothing
            if _writable(param.array):
                param.array[...] = value
            else:  # a copy: never the caller's array, which its owner may go on updating
                param.array = param.namespace.xp.asarray(value, copy=True)
            param._version += 1  # a graph recorded before the load would differentiate old values

    def to(self, ad: Autodiff) -> Self:
        """Move every parameter to the namespace of ``ad`` (through numpy on the client),
        keeping the same tensor objects so optimizers built on them keep working; returns
        the module.

        A moved parameter's gradient is dropped (it lives on the old device), and its version
        is bumped so a graph recorded before the move refuses backward() instead of sending a
        gradient from the old device into it. Optimizers move their state on their next step.
        """
        for param in self.parameters():
            if param.namespace.xp is not ad.xp:
                param.array = ad.xp.asarray(np.array(param.array, copy=True))
                param.grad = None
                param._version += 1
            param._ad = ad
        return self

    # --- files --------------------------------------------------------------------------------
    def save(self, path: weights.PathLike, metadata: Mapping[str, str] | None = None) -> None:
        """Write the parameters to ``path`` as a safetensors file (see ``client.nn.save``)."""
        weights.save(self, path, metadata)

    def load(self, path: weights.PathLike) -> Self:
        """Load the parameters from a safetensors file at ``path`` (``load_state_dict`` of
        ``client.nn.load(path)``); returns the module."""
        self.load_state_dict(weights.load(path))
        return self

    # --- printing -----------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """What a layer's line shows between its parentheses (its constructor arguments)."""
        return ""

    def __repr__(self) -> str:
        lines = [
            f"({name}): " + repr(child).replace("\n", "\n  ")
            for name, child in self._modules.items()
        ]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ")" if not lines else head + "\n  " + "\n  ".join(lines) + "\n)"


def _shape_of(value: Any) -> tuple[int, ...]:
    value = value.array if isinstance(value, Tensor) else value
    return tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))


def _check_fits(owner: str, own: Mapping[str, Tensor], state: Mapping[str, Any]) -> None:
    """Raise StateDictError naming the first way ``state`` does not fit ``own``."""
    missing = [name for name in own if name not in state]
    unexpected = [name for name in state if name not in own]
    tally = f"({len(missing)} missing, {len(unexpected)} unexpected in all)"
    if missing:
        raise StateDictError(
            f"load_state_dict: missing name {missing[0]!r}: the state dict has no value for "
            f"this parameter of {owner} {tally}"
        )
    if unexpected:
        raise StateDictError(
            f"load_state_dict: unexpected name {unexpected[0]!r}: {owner} has no parameter "
            f"of that name {tally}"
        )
    for name, param in own.items():
        shape = _shape_of(state[name])
        if shape != param.shape:
            raise StateDictError(
                f"load_state_dict: shape mismatch for {name!r}: the parameter has shape "
                f"{param.shape}, the state dict's value {shape}"
            )


def _on_device_of(param: Tensor, value: Any) -> Any:
    """``value`` as an array of ``param``'s namespace and dtype: itself when it already is
    one (a tensor's array), cast on the device when only its dtype differs, else through
    numpy (one read, one upload)."""
    value = value.array if isinstance(value, Tensor) else value
    xp = param.namespace.xp
    if not (hasattr(value, "__array_namespace__") and value.__array_namespace__() is xp):
        value = xp.asarray(np.asarray(value))
    return value if value.dtype == param.dtype else xp.astype(value, param.dtype)


def _writable(array: Any) -> bool:
    """Whether ``array`` takes values in place: any array but a read-only numpy one."""
    flags = getattr(array, "flags", None)
    return flags is None or bool(flags.writeable)
