"""``Module``: the container of parameters and submodules every layer and model derives from,
with PyTorch's names (``parameters()``, ``named_parameters()``, ``train()``/``eval()``,
``state_dict()``/``load_state_dict()``, ``register_buffer()``), over tensors of any autodiff
namespace.

Registration is by assignment, as in PyTorch: in ``__init__``, ``self.fc = Linear(...)``
registers a submodule and ``self.scale = ad.asarray(..., requires_grad=True)`` a parameter,
in the order assigned. A parameter is a leaf tensor that requires grad. A buffer is a tensor
that is part of the module's state without being trained (batch norm's running statistics):
registered by ``register_buffer``, it is in ``state_dict()`` and weights files but not in
``parameters()``. Any other value (a constant tensor, a number) is a plain attribute that no
optimizer or weights file sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Self

import numpy as np

from client.autodiff import Autodiff, Tensor

from . import loading, weights
from .loading import StateDictError as StateDictError


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
    _buffers: dict[str, Tensor | None]
    _non_persistent: set[str]
    _modules: dict[str, Module]
    training: bool
    # An attribute, not a method, as PyTorch's: subclasses define forward with their own
    # signature, which a method here would make an incompatible override for mypy.
    forward: Callable[..., Any] = _forward_unimplemented

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
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
        if name in self._buffers:  # a buffer stays one, in its place, as PyTorch's
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign a {type(value).__name__} to buffer {name!r} of "
                    f"{type(self).__name__}: assign a tensor or None"
                )
            self._buffers[name] = value
            object.__setattr__(self, name, value)
            return
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
        self._buffers.pop(name, None)
        self._non_persistent.discard(name)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Register ``tensor`` as the buffer ``name``: state that is not trained (a running
        statistic), read as ``self.name``, in ``state_dict()`` and weights files after the
        module's parameters unless ``persistent=False``, never in ``parameters()``.

        Raises:
            TypeError: ``tensor`` is neither a tensor nor None, or requires grad (a parameter).
            KeyError: ``name`` is empty, dotted, or already an attribute other than a buffer.
        """
        owner = type(self).__name__
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"register_buffer: {name!r} is not a buffer name (no dots, not empty)")
        if name not in self._buffers and name in self.__dict__:
            raise KeyError(f"register_buffer: {owner} already has an attribute {name!r}")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"register_buffer: buffer {name!r} of {owner} must be a tensor or None, not a "
                f"{type(tensor).__name__} (ad.asarray(...) makes one)"
            )
        if tensor is not None and tensor.requires_grad:
            raise TypeError(
                f"register_buffer: buffer {name!r} of {owner} requires grad: a trained tensor is "
                "a parameter; register a detached one"
            )
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, tensor)

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

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        """Every buffer once (None ones left out), with dotted names, module by module as
        :meth:`named_parameters`."""
        for name, buffer, _ in self._named_buffers(prefix, recurse):
            yield name, buffer

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def _named_buffers(
        self, prefix: str = "", recurse: bool = True
    ) -> Iterator[tuple[str, Tensor, bool]]:
        """``(name, buffer, persistent)`` for every buffer once."""
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for module_name, module in modules:
            for name, buffer in module._buffers.items():
                if buffer is not None and id(buffer) not in seen:
                    seen.add(id(buffer))
                    persistent = name not in module._non_persistent
                    yield (f"{module_name}.{name}" if module_name else name), buffer, persistent

    def _named_state(self) -> dict[str, Tensor]:
        """What ``state_dict()`` holds, as tensors, in PyTorch's order: module by module
        (parents first), each module's parameters and then its persistent buffers; each
        tensor once, under its first name."""
        state: dict[str, Tensor] = {}
        seen: set[int] = set()
        for module_name, module in self.named_modules():
            buffers = [
                (name, b)
                for name, b in module._buffers.items()
                if name not in module._non_persistent
            ]
            for name, tensor in [*module._parameters.items(), *buffers]:
                if tensor is not None and id(tensor) not in seen:
                    seen.add(id(tensor))
                    state[f"{module_name}.{name}" if module_name else name] = tensor
        return state

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
        """The parameters' and persistent buffers' arrays by dotted name, in PyTorch's order
        (each module's parameters, then its buffers, parents before children): the wrapped
        namespace's arrays themselves (no copy, nothing read from a remote device)."""
        return {name: tensor.array for name, tensor in self._named_state().items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy ``state``'s values (numpy arrays, arrays of any namespace, tensors) into the
        parameters and persistent buffers, on the device each is on, cast to its dtype.

        The names must match exactly and every shape must fit; nothing is copied otherwise.
        As PyTorch's, the values are written into the parameters' own arrays in place, so an
        optimizer built on the parameters, and a step recorded by ``client.capture.jit`` that
        reads their arrays, see the loaded values. A parameter whose array cannot take them
        in place (a read-only numpy array) gets a new array of its own instead.

        Raises:
            StateDictError: naming the first mismatch: a missing name, then an unexpected
                one, then a shape that differs.
        """
        loading.load_into(type(self).__name__, self._named_state(), state)

    def to(self, ad: Autodiff) -> Self:
        """Move every parameter and buffer to the namespace of ``ad`` (through numpy on the
        client), keeping the same tensor objects so optimizers built on them keep working;
        returns the module.

        A moved parameter's gradient is dropped (it lives on the old device), and its version
        is bumped so a graph recorded before the move refuses backward() instead of sending a
        gradient from the old device into it. Optimizers move their state on their next step.
        """
        for param in [*self.parameters(), *self.buffers()]:
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
