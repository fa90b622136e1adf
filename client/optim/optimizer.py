"""``Optimizer``: parameter groups, per-parameter state, ``zero_grad()`` and ``step()``, with
PyTorch's names, over tensors of any autodiff namespace.

An optimizer's state (momentum buffers, Adam's moments) is made with the parameter's own
namespace, so it lives where the parameter lives: on the server for a remote model, where the
updates run as in-place ops and nothing travels but the ops. Each op is one message to a remote
device, so each optimizer says how many it issues per parameter per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from client.autodiff import Tensor, enable_grad, no_grad

Params = Iterable[Tensor] | Iterable[Mapping[str, Any]]


class Optimizer:
    """The base of every optimizer: ``param_groups`` (dicts with ``"params"`` and the
    hyper-parameters, ``"lr"`` among them, which schedulers set) and ``state`` (a dict per
    parameter, keyed by the parameter tensor itself: tensors hash by identity).

    A subclass defines ``_update(param, grad, group, state)``, called inside ``no_grad()``
    for every parameter that has a gradient, with the gradient's raw array.
    """

    def __init__(self, params: Params, defaults: Mapping[str, Any]) -> None:
        if isinstance(params, Tensor):
            raise TypeError(
                "params must be an iterable of tensors (model.parameters(), or "
                "[tensor]), not a single tensor"
            )
        self.defaults: dict[str, Any] = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[Tensor, dict[str, Any]] = {}
        given = list(params)
        if not given:
            raise ValueError("the optimizer got an empty parameter list")
        if all(isinstance(g, Mapping) for g in given):
            for group in given:
                assert isinstance(group, Mapping)
                self.add_param_group(group)
        else:
            self.add_param_group({"params": given})

    def __repr__(self) -> str:
        groups = []
        for group in self.param_groups:
            hyper = ", ".join(f"{k}={v!r}" for k, v in group.items() if k != "params")
            groups.append(f"{{{hyper}, params={len(group['params'])}}}")
        return f"{type(self).__name__}({', '.join(groups)})"

    def add_param_group(self, group: Mapping[str, Any]) -> None:
        """Add a group of parameters with its own hyper-parameters (the rest from the
        optimizer's defaults), as PyTorch's, for a layer trained at its own learning rate."""
        if "params" not in group:
            raise ValueError("a parameter group needs a 'params' entry")
        raw = group["params"]
        params = [raw] if isinstance(raw, Tensor) else list(raw)
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        for index, param in enumerate(params):
            _check_parameter(index, param)
            if id(param) in taken:
                raise ValueError(
                    f"parameter {index} of the group appears twice, or is in "
                    "another group already: each parameter belongs to one group"
                )
            taken.add(id(param))
        self.param_groups.append({**self.defaults, **group, "params": params})

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (``.grad = None``), so the next backward() starts
        afresh; the arrays are freed rather than zeroed (no op is sent)."""
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient (one without is skipped, as one that
        took no part in the loss). ``closure``, when given, recomputes the loss first (its
        result is returned)."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                stepping = []
                for param in group["params"]:
                    grad = param.grad if param.requires_grad else None
                    if grad is not None:
                        stepping.append((param, grad.array, self._state_of(param)))
                self._begin_group(group, [(param, state) for param, _, state in stepping])
                for param, grad_array, state in stepping:
                    self._update(param, grad_array, group, state)
        return loss

    def _begin_group(self, group: dict[str, Any],
                     stepping: list[tuple[Tensor, dict[str, Any]]]) -> None:  # fmt: skip
        """Called inside ``no_grad()`` once per group per step, before its ``_update`` calls,
        with the parameters that have a gradient and their state: where a subclass computes
        what the whole group shares at this step (Adam's bias corrections)."""

    def _update(self, param: Tensor, grad: Any, group: dict[str, Any],
                state: dict[str, Any]) -> None:  # fmt: skip
        raise NotImplementedError(f"{type(self).__name__} defines no _update()")

    def _state_of(self, param: Tensor) -> dict[str, Any]:
        """``param``'s state, its arrays moved first if the parameter moved to another
        namespace (``Module.to``) since they were made: they follow it through numpy, once."""
        state = self.state.setdefault(param, {})
        array = param.array
        for key, value in state.items():
            if hasattr(value, "__array_namespace__"):
                state[key] = follow(value, array, param.namespace.xp)
        return state


def follow(value: Any, array: Any, xp: Any) -> Any:
    """``value`` (an array) where ``array`` lives: itself, or, if ``array`` is of another type
    or on another device (a model moved to a server), a copy moved there through numpy."""
    # Local attribute reads only, as this runs for every state array at every step.
    if type(value) is not type(array) or value.device != array.device:
        return xp.asarray(np.array(value, copy=True))
    return value


def _check_parameter(index: int, param: Any) -> None:
    if not isinstance(param, Tensor):
        raise TypeError(f"parameter {index} is a {type(param).__name__}, not a Tensor")
    if not param.is_leaf:
        raise ValueError(
            f"parameter {index} is not a leaf (it was computed by {param.op}); an "
            "optimizer updates tensors created with requires_grad=True"
        )
    # A parameter that does not require grad (frozen) is accepted and skipped by step(), as
    # PyTorch's optimizers do: unfreezing it later makes it train.


def check_nonnegative(**values: float) -> None:
    """A ValueError naming the first negative hyper-parameter, as PyTorch's ``Invalid ...``."""
    for name, value in values.items():
        if not value >= 0.0:  # NaN fails too
            raise ValueError(f"invalid {name}: {value} (must be >= 0)")
