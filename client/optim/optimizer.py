"""``Optimizer``: parameter groups, per-parameter state, ``zero_grad()`` and ``step()``, with
PyTorch's names, over tensors of any autodiff namespace.

An optimizer's state (momentum buffers, Adam's moments) is made with the parameter's own
namespace, so it lives where the parameter lives: on the server for a remote model, where the
updates run as in-place ops and nothing travels but the ops. Each op is one message to a remote
device, so each optimizer says how many it issues per parameter per step.

The learning rate lives there too, as tinygrad keeps it: besides ``group["lr"]`` (the Python
float that schedulers and users read), each group holds it as 0-d arrays, one per array type,
device and dtype its updates use, made at the first step that needs one. The update ops read
those arrays, never the float, so a step sends the same ops whatever the rate, and a step
recorded once (``client.capture.jit``) and replayed by id follows a schedule: a replay runs no
Python, but it reads the arrays, whose values :meth:`Optimizer.set_lr` (which schedulers call)
writes in place between steps. An array of the parameter's dtype holds exactly the value
numpy would have cast the float to beside that parameter, so the results are those of the
float, bit for bit. ``step()`` also writes a ``group["lr"]`` assigned directly since the last
write, which is right without a recorded step but not under replay: change the rate of a
jitted step with ``set_lr`` or a scheduler, between steps.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from client.autodiff import Tensor, enable_grad, no_grad

Params = Iterable[Tensor] | Iterable[Mapping[str, Any]]


class Optimizer:
    """The base of every optimizer: ``param_groups`` (dicts with ``"params"`` and the
    hyper-parameters, ``"lr"`` among them, which :meth:`set_lr` and schedulers set) and
    ``state`` (a dict per parameter, keyed by the parameter tensor itself: tensors hash by
    identity).

    A subclass defines ``_update(param, grad, group, state)``, called inside ``no_grad()``
    for every parameter that has a gradient, with the gradient's raw array. Its ops take the
    rate from :meth:`lr_array`, not from ``group["lr"]``, so that a recorded step follows a
    schedule (module docstring).
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
        # Each group's rate on the devices, beside (not inside) its dict: a group dict copied
        # into another optimizer must not share them.
        self._rates: list[_DeviceRate] = []
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
        # A rate assigned to group["lr"] since the last write (see the module docstring), every
        # group's checked before any is written.
        rates = [_checked_lr(group["lr"]) for group in self.param_groups]
        for group, rate in zip(self.param_groups, rates, strict=True):
            self._rate_of(group).write(rate, group["params"])
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

    def set_lr(self, lr: float, group_index: int | None = None) -> None:
        """Set the learning rate of group ``group_index`` (of every group when None):
        ``group["lr"]``, and the group's arrays on the devices, written in place now (two ops
        per array on a remote device, none when the rate is unchanged). Schedulers call it;
        call it between steps, not inside a recorded one. Raises ValueError for a negative
        or NaN rate, TypeError for one that is not a real number, IndexError for a group
        that does not exist; nothing is written then."""
        value = _checked_lr(lr)
        if group_index is None:
            groups = self.param_groups
        else:
            index, count = operator.index(group_index), len(self.param_groups)
            if not -count <= index < count:
                raise IndexError(
                    f"group_index {index} is out of range: the optimizer has {count} "
                    f"parameter group{'s' if count != 1 else ''}"
                )
            groups = [self.param_groups[index]]
        for group in groups:
            group["lr"] = value
            self._rate_of(group).write(value, group["params"])

    def lr_array(self, group: dict[str, Any], xp: Any, like: Any, dtype: Any = None) -> Any:
        """``group``'s learning rate as a 0-d array of ``xp`` where ``like`` (an array) lives,
        in ``dtype`` (``like``'s when None): the one the group holds there, made the first
        time it is asked for (one op). An update op uses it where it would use
        ``group["lr"]``; it holds what ``group["lr"]`` held at this step's start."""
        return self._rate_of(group).array(xp, like, like.dtype if dtype is None else dtype)

    def _rate_of(self, group: dict[str, Any]) -> _DeviceRate:
        for rate in self._rates:
            if rate.group is group:
                return rate
        rate = _DeviceRate(group, _checked_lr(group["lr"]))  # at its first step or set_lr()
        self._rates.append(rate)
        return rate

    def _begin_group(
        self, group: dict[str, Any], stepping: list[tuple[Tensor, dict[str, Any]]]
    ) -> None:
        """Called inside ``no_grad()`` once per group per step, before its ``_update`` calls,
        with the parameters that have a gradient and their state: where a subclass computes
        what the whole group shares at this step (Adam's bias corrections)."""

    def _update(
        self, param: Tensor, grad: Any, group: dict[str, Any], state: dict[str, Any]
    ) -> None:
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


class _DeviceRate:
    """One group's learning rate on the devices: 0-d arrays, one per (array type, device,
    dtype) asked for, and the value they all hold (the last written)."""

    __slots__ = ("group", "value", "arrays")

    def __init__(self, group: dict[str, Any], value: float) -> None:
        self.group, self.value = group, value
        self.arrays: list[Any] = []

    def array(self, xp: Any, like: Any, dtype: Any) -> Any:
        """The array where ``like`` lives in ``dtype``; made (one op) if there is none yet."""
        for array in self.arrays:
            if array.dtype == dtype and lives_with(array, like):
                return array
        made = xp.full((), self.value, dtype=dtype, device=like.device)
        self.arrays.append(made)
        return made

    def write(self, value: float, params: list[Tensor]) -> None:
        """Hold ``value`` from now on: written into each array (in place, so a recorded step
        that reads it sees the new value) where one of ``params`` still lives; an array left
        behind by parameters that moved (``Module.to``) is dropped, not written."""
        if value == self.value and math.copysign(1.0, value) == math.copysign(1.0, self.value):
            return  # the same float, its sign of zero included: nothing to write
        self.arrays = [a for a in self.arrays if any(lives_with(a, p.array) for p in params)]
        for array in self.arrays:
            # A Python float assigned to an array takes its dtype as it would beside it in
            # an op (the same rounding), 0.0 included.
            array[...] = value
        self.value = value


def lives_with(value: Any, array: Any) -> bool:
    """Whether ``value`` (an array) is where ``array`` is: the same type, the same device."""
    return type(value) is type(array) and value.device == array.device


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


def _checked_lr(lr: Any) -> float:
    """``lr`` as a float; a TypeError if it is not a real number, a ValueError if negative."""
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise TypeError(f"the learning rate must be a real number, not {type(lr).__name__}")
    value = float(lr)
    check_nonnegative(lr=value)
    return value


def check_nonnegative(**values: float) -> None:
    """A ValueError naming the first negative hyper-parameter, as PyTorch's ``Invalid ...``."""
    for name, value in values.items():
        if not value >= 0.0:  # NaN fails too
            raise ValueError(f"invalid {name}: {value} (must be >= 0)")
