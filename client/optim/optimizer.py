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

import itertools
import math
import numbers
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from client.autodiff import Tensor, enable_grad, no_grad

from .placement import follow, lives_with, load_array

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

    # --- state dicts: PyTorch's layout --------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state in PyTorch's layout: ``{"state": {index: {...}},
        "param_groups": [{hyper-parameters..., "params": [index, ...]}]}``, the parameters
        numbered in group order from 0, ``state`` holding only those that have some. Each
        group also carries the PyTorch options this optimizer has fixed (``maximize=False``
        ...), so the layout is torch's. The state's arrays are the optimizer's own (no copy,
        nothing read from a remote device): save them (``client.checkpoint``) or copy them
        before the next step changes them in place."""
        state: dict[int, dict[str, Any]] = {}
        groups: list[dict[str, Any]] = []
        numbers = itertools.count()
        for group in self.param_groups:
            indices = []
            for param in group["params"]:
                index = next(numbers)
                indices.append(index)
                saved = self._saved_state(self.state.get(param, {}))
                if saved:
                    state[index] = saved
            hyper = {key: value for key, value in group.items() if key != "params"}
            groups.append({**hyper, **self._fixed_options, "params": indices})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take the state and hyper-parameters of ``state_dict`` (from :meth:`state_dict`,
        this optimizer's or a twin's, or read back from a checkpoint: arrays of any
        namespace, state keys as ints or strings): the parameters match by position, group
        by group, as PyTorch's. Each state array is written where its parameter lives, in
        place into the array the optimizer holds there when its shape and dtype fit (so a
        step recorded by ``client.capture.jit`` reads the loaded values), else as a new
        array; the learning rates through :meth:`set_lr`. Everything is checked before
        anything is written.

        Raises:
            ValueError: the groups or their sizes differ, a state entry names no parameter
                or has an array of the wrong shape, or a fixed option differs.
        """
        saved_groups, entries = _parts(state_dict)
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the state dict has {len(saved_groups)} parameter groups, the optimizer "
                f"{len(self.param_groups)}"
            )
        by_index: dict[int, Tensor] = {}
        for number, (group, saved) in enumerate(zip(self.param_groups, saved_groups, strict=True)):
            indices = [operator.index(i) for i in saved.get("params", ())]
            if len(indices) != len(group["params"]):
                raise ValueError(
                    f"parameter group {number} has {len(group['params'])} parameters, its "
                    f"state dict {len(indices)}"
                )
            by_index.update(zip(indices, group["params"], strict=True))
            self._check_options(number, saved)
            _checked_lr(saved.get("lr"))
        loaded: dict[Tensor, Mapping[str, Any]] = {}
        for key, entry in entries.items():
            param = by_index.get(int(key))
            if param is None:
                raise ValueError(
                    f"the state dict has state for parameter {key}, which no group has"
                )
            for name, value in entry.items():
                shape = tuple(getattr(value, "shape", ()))
                if shape not in ((), tuple(param.shape)):
                    raise ValueError(
                        f"state {name!r} of parameter {key} has the shape {shape}, the "
                        f"parameter {tuple(param.shape)}"
                    )
            loaded[param] = entry
        for number, (group, saved) in enumerate(zip(self.param_groups, saved_groups, strict=True)):
            for key, value in saved.items():
                if key not in ("params", "lr") and key not in self._fixed_options:
                    group[key] = tuple(value) if isinstance(value, list) else value
            self.set_lr(saved["lr"], group_index=number)
            self._load_group_state(group, [(p, loaded.get(p)) for p in group["params"]])

    # PyTorch's options that this optimizer has fixed, in its state dict's groups.
    _fixed_options: Mapping[str, Any] = {
        "maximize": False,
        "foreach": None,
        "differentiable": False,
        "fused": None,
    }

    def _check_options(self, number: int, saved: Mapping[str, Any]) -> None:
        for key, fixed in self._fixed_options.items():
            if saved.get(key, fixed) != fixed:
                raise ValueError(
                    f"parameter group {number} has {key}={saved[key]!r}; "
                    f"{type(self).__name__} supports only {key}={fixed!r}"
                )

    def _saved_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A parameter's state as its state dict holds it (a subclass may unpack objects)."""
        return dict(state)

    def _load_group_state(
        self, group: dict[str, Any], loading: Sequence[tuple[Tensor, Mapping[str, Any] | None]]
    ) -> None:
        """Put each parameter's loaded state (None: none) in place of what it holds: arrays
        through :func:`load_array`, in the parameter's dtype, anything else as it is."""
        for param, entry in loading:
            old = self.state.pop(param, {})
            if entry:
                self.state[param] = {
                    key: load_array(old.get(key), value, param, param.dtype)
                    if hasattr(value, "shape")
                    else value
                    for key, value in entry.items()
                }

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


def _parts(state_dict: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], Mapping[Any, Any]]:
    """A state dict's groups and state, or a ValueError saying it is not one."""
    groups, entries = state_dict.get("param_groups"), state_dict.get("state")
    if not isinstance(groups, list | tuple) or not isinstance(entries, Mapping):
        raise ValueError(
            "an optimizer state dict has 'param_groups' (a list) and 'state' (a mapping), "
            f"not the keys {sorted(map(str, state_dict))}"
        )
    return list(groups), entries


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
