"""Adam and AdamW: PyTorch's ``torch.optim.Adam`` (weight decay as L2, added to the gradient)
and ``torch.optim.AdamW`` (weight decay decoupled, applied to the parameter).

Replay-safe: no value that changes from step to step travels as a Python scalar inside an op.
The bias corrections, which do (``1 - beta**t``), are computed on the device from ``beta1**t``
and ``beta2**t`` kept there as 0-d arrays and multiplied in place each step, so every step
after the first sends the same ops with the same scalars, and a graph captured from one step
replays the next ones exactly as running them would. The learning rate, which a schedule
changes, is read from the group's 0-d array on the device (:mod:`client.optim.optimizer`), in
the powers' float64, so the step size and AdamW's decay factor are computed in float64 from
the same double as the Python float would be, then cast to the parameter's dtype.
The other hyper-parameters travel as Python scalars: constant, the same in every step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from client.autodiff import Tensor
from client.autodiff.extension import Extension, find_extension

from .optimizer import Optimizer, Params, check_nonnegative
from .placement import follow, lives_with, load_array


class Adam(Optimizer):
    """Adam, as PyTorch's (without amsgrad), with ``g`` the gradient and ``t`` the step::

        g = g + weight_decay * p                       (Adam's L2; AdamW decays p instead)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    ``m`` (``exp_avg``) and ``v`` (``exp_avg_sq``) are arrays of the parameter's namespace,
    updated in place. ``beta1**t`` and ``beta2**t`` are 0-d arrays there too (float64 where
    the device has it), shared by the parameters of a group that have taken every step
    together, and from them each step computes, once for them all, the step size and the eps
    term (cast to each parameter dtype they meet). A parameter that skips a step (no
    gradient) parts from the others with a copy of its own, so each keeps PyTorch's
    per-parameter ``t``. ``state["step"]``, a Python int, is kept for compatibility; a
    replayed step does not advance it: the device arrays are the truth.

    Ops per step, each one message to a remote device: 4 per parameter where its namespace
    has the optimizer extension's ops (a remote one; ``protocol/ops/optim.py``):
    ``moment_update`` for m and for v, ``adam_direction`` and ``p -=``, the same numpy calls
    as the chains below make op by op. Elsewhere, or for a parameter whose gradient or
    moments differ from it in dtype or shape, 12 (3 for m, 4 for v, 5 for p: ``sqrt``, ``+=``
    eps term, ``*`` step size, ``/``, ``p -=``). Either way +2 with Adam's weight decay, +1
    with AdamW's; 8 per group (``*=`` twice for the powers, then ``1 -``,
    ``sqrt``, ``lr *``, ``1 -``, ``/``, ``eps *``), +2 per parameter dtype other than the
    powers' (``astype``), once per step count where parameters skipped steps; with AdamW's
    weight decay +2 per group (``lr * weight_decay``, ``1 -``), +1 per parameter dtype other
    than the powers'. The first step also makes the state: +2 per parameter (the zeros), +3
    per group (the ones, the learning rate).
    """

    _decoupled = False  # AdamW: weight decay applied to the parameter, not the gradient

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        check_nonnegative(lr=lr, eps=eps, weight_decay=weight_decay)
        beta1, beta2 = betas
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"invalid betas: {betas} (each must be in [0, 1))")
        defaults = {
            "lr": lr,
            "betas": (float(beta1), float(beta2)),
            "eps": eps,
            "weight_decay": weight_decay,
        }
        super().__init__(params, defaults)
        # AdamW's 1 - lr * weight_decay at this group's step: (an array where it lives, factor)
        self._decay_factors: list[tuple[Any, Any]] = []

    def _begin_group(
        self, group: dict[str, Any], stepping: list[tuple[Tensor, dict[str, Any]]]
    ) -> None:
        # How many stepping parameters hold each set of powers where it lives: when that is
        # all of its members, it advances in place (every step but one where some parted).
        beside: dict[int, int] = {}
        for param, state in stepping:
            powers = state.get("bias_powers")
            if powers is not None and powers.lives_with(param.array):
                beside[id(powers)] = beside.get(id(powers), 0) + 1
        advancing: list[tuple[_BiasPowers | None, _BiasPowers, list[Any]]] = []  # was, is, dtypes
        for param, state in stepping:
            was: _BiasPowers | None = state.get("bias_powers")
            array = param.array
            entry = next((e for e in advancing if e[0] is was and e[1].lives_with(array)), None)
            if entry is None:
                if was is not None and was.lives_with(array) and beside[id(was)] == was.members:
                    entry = (was, was, [])
                else:  # new, or parting from parameters that skip this step (or moved)
                    entry = (was, _BiasPowers.start(param, was), [])
                advancing.append(entry)
            _, powers, dtypes = entry
            if not any(dtype == param.dtype for dtype in dtypes):
                dtypes.append(param.dtype)
            if powers is not was:
                if was is not None:
                    was.members -= 1
                powers.members += 1
                state["bias_powers"] = powers
        for _, powers, dtypes in advancing:
            powers.advance(group, self.lr_array(group, powers.xp, powers.beta1_power), dtypes)
        if self._decoupled and float(group["weight_decay"]) != 0:
            self._decay_factors = self._decay_factors_for(group, stepping)

    _fixed_options = {
        **Optimizer._fixed_options,
        "amsgrad": False,
        "capturable": False,
        "decoupled_weight_decay": False,
    }

    def _saved_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """PyTorch's ``step``, ``exp_avg`` and ``exp_avg_sq``, and the bias powers
        ``beta1_power`` and ``beta2_power`` (0-d): what the device knows of ``t``, which a
        replayed step advances and ``step`` does not, so a loaded state resumes exactly."""
        if "step" not in state:
            return {}
        powers = state["bias_powers"]
        return {
            "step": state["step"],
            "exp_avg": state["exp_avg"],
            "exp_avg_sq": state["exp_avg_sq"],
            "beta1_power": powers.beta1_power,
            "beta2_power": powers.beta2_power,
        }

    def _load_group_state(
        self, group: dict[str, Any], loading: Sequence[tuple[Tensor, Mapping[str, Any] | None]]
    ) -> None:
        """The moments through the base; the bias powers shared again by the parameters
        whose loaded powers are equal (read to compare: two 0-d reads per remote parameter),
        written in place into the powers they share now where those are theirs alone (a
        recorded step holds them). A state without powers (PyTorch's) gets ``beta**step``
        by repeated products, as the steps would have made them."""
        betas = [float(b) for b in group["betas"]]
        held = {id(p): self.state.get(p, {}).get("bias_powers") for p, _ in loading}
        moments = [(p, _moments(e)) for p, e in loading]
        super()._load_group_state(group, moments)
        sharing: dict[tuple[Any, ...], list[Tensor]] = {}
        for param, entry in loading:
            was = held[id(param)]
            if was is not None:
                was.members -= 1
            if entry:
                if _POWERS[0] in entry:
                    values = [float(np.asarray(entry[name])) for name in _POWERS]
                else:
                    values = [_power(beta, int(entry["step"])) for beta in betas]
                array = param.array
                sharing.setdefault((*values, type(array), str(array.device)), []).append(param)
        for (*values, _, _), params in sharing.items():
            first = params[0]
            olds = {id(held[id(p)]): held[id(p)] for p in params}
            old = olds.popitem()[1] if len(olds) == 1 else None
            if old is not None and (old.members != 0 or not old.lives_with(first.array)):
                old = None  # shared with parameters that load other powers, or elsewhere
            dtype = _widest_float(first.namespace.xp, first.array)
            arrays = [
                load_array(getattr(old, name, None), np.float64(value), first, dtype)
                for name, value in zip(_POWERS, values, strict=True)
            ]
            powers = old if old is not None else _BiasPowers(first.namespace.xp, *arrays)
            powers.members = len(params)
            for param in params:
                self.state[param]["bias_powers"] = powers

    def _decay_factors_for(
        self,
        group: dict[str, Any],
        stepping: list[tuple[Tensor, dict[str, Any]]],
    ) -> list[tuple[Any, Any]]:
        """AdamW's ``1 - lr * weight_decay`` for this step, computed as PyTorch's Python float
        is (in float64, where the device has it) once per device, and cast to each parameter
        dtype there, as numpy casts the float beside the parameter. Each with a parameter's
        array, which says where it lives (numpy makes scalars of 0-d results)."""
        weight_decay = float(group["weight_decay"])
        wide: list[tuple[Any, Any]] = []  # one per device, in the dtype of the bias powers
        factors: list[tuple[Any, Any]] = []
        for param, _ in stepping:
            array, xp = param.array, param.namespace.xp
            if any(a.dtype == array.dtype and lives_with(a, array) for a, _ in factors):
                continue
            factor = next((f for a, f in wide if lives_with(a, array)), None)
            if factor is None:
                lr = self.lr_array(group, xp, array, _widest_float(xp, array))
                factor = 1.0 - lr * weight_decay
                wide.append((array, factor))
            factors.append((array, xp.astype(factor, array.dtype, copy=False)))
        return factors

    def _update(
        self, param: Tensor, grad: Any, group: dict[str, Any], state: dict[str, Any]
    ) -> None:
        # Python floats: a numpy float64 hyper-parameter would promote float32 arrays.
        weight_decay = float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        xp = param.namespace.xp
        if "step" not in state:  # the state so far: its bias powers, from _begin_group
            state.update(
                step=0, exp_avg=xp.zeros_like(param.array), exp_avg_sq=xp.zeros_like(param.array)
            )
        state["step"] += 1
        g = grad  # never changed in place: it is the user's .grad
        if weight_decay != 0:
            if self._decoupled:
                array = param.array
                param *= next(
                    f
                    for a, f in self._decay_factors
                    if a.dtype == array.dtype and lives_with(a, array)
                )
            else:
                g = g + weight_decay * param.array
        m, v = state["exp_avg"], state["exp_avg_sq"]
        step_size, eps_term = state["bias_powers"].terms_for(param.dtype)
        fused = _fused_ops(param.namespace.xp, param.array, g, m, v)
        if fused is not None:  # the same numpy calls on the device, one op per chain
            m = fused.moment_update(m, g, decay=beta1, scale=1.0 - beta1, squared=False)
            v = fused.moment_update(v, g, decay=beta2, scale=1.0 - beta2, squared=True)
            state["exp_avg"], state["exp_avg_sq"] = m, v
            param -= fused.adam_direction(m, v, step_size, eps_term)
            return
        m *= beta1
        m += (1.0 - beta1) * g
        v *= beta2
        v += ((1.0 - beta2) * g) * g
        state["exp_avg"], state["exp_avg_sq"] = m, v
        # PyTorch's denominator sqrt(v) / sqrt(bc2) + eps, with sqrt(bc2) moved into the step
        # size and the eps term: the same value, no array divided by sqrt(bc2).
        denom = xp.sqrt(v)
        denom += eps_term
        param -= (step_size * m) / denom


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter), as PyTorch's: before the Adam
    step, ``p *= 1 - lr * weight_decay`` (one op), the gradient untouched. Its default
    ``weight_decay`` is 1e-2, PyTorch's."""

    _decoupled = True
    _fixed_options = {**Adam._fixed_options, "decoupled_weight_decay": True}

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


_POWERS = ("beta1_power", "beta2_power")  # the bias powers' names in a state dict


def _moments(entry: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A loaded entry without its bias powers, its ``step`` a Python int (PyTorch's is a
    0-d tensor)."""
    if not entry:
        return entry
    kept = {k: v for k, v in entry.items() if k not in _POWERS}
    return {**kept, "step": int(np.asarray(entry["step"]))}


def _power(beta: float, step: int) -> float:
    """``beta**step`` as ``step`` in-place products from 1.0 make it on the device."""
    power = 1.0
    for _ in range(step):
        power *= beta
    return power


class _BiasPowers:
    """``beta1**t`` and ``beta2**t`` as 0-d arrays where the parameters live, shared by the
    parameters of a group that have taken every step together (so have the same ``t``), and
    this step's step size and eps term made from them, one pair per parameter dtype."""

    __slots__ = ("xp", "beta1_power", "beta2_power", "members", "terms")

    def __init__(self, xp: Any, beta1_power: Any, beta2_power: Any) -> None:
        self.xp = xp
        self.beta1_power, self.beta2_power = beta1_power, beta2_power
        self.members = 0  # how many parameters' states hold these powers
        self.terms: list[tuple[Any, Any, Any]] = []  # (dtype, step size, eps term)

    @classmethod
    def start(cls, param: Tensor, parting: _BiasPowers | None) -> _BiasPowers:
        """Powers where ``param`` lives: a copy of ``parting``'s (a parameter that parts from
        the others, which keep theirs), or ones (``t = 0``) for a parameter's first step."""
        xp, array = param.namespace.xp, param.array
        if parting is None:
            dtype = _widest_float(xp, array)
            return cls(xp, *(xp.ones((), dtype=dtype, device=array.device) for _ in "12"))
        copies = (
            _copy_to(power, array, xp) for power in (parting.beta1_power, parting.beta2_power)
        )
        return cls(xp, *copies)

    def lives_with(self, array: Any) -> bool:
        """Whether these arrays are where ``array`` is (the same type and device)."""
        return lives_with(self.beta1_power, array)

    def advance(self, group: dict[str, Any], lr: Any, dtypes: list[Any]) -> None:
        """``t += 1``, and this step's step size ``lr * sqrt(bc2) / bc1`` and eps term
        ``eps * sqrt(bc2)`` for each of ``dtypes``, by ops on the device (PyTorch's
        ``bc = 1 - beta**t``), ``lr`` the group's rate there in the powers' dtype; the only
        scalars in them are the group's other hyper-parameters, constant."""
        eps = float(group["eps"])
        beta1, beta2 = (float(b) for b in group["betas"])
        xp = self.xp
        self.beta1_power *= beta1
        self.beta2_power *= beta2
        root_bc2 = xp.sqrt(1.0 - self.beta2_power)
        step_size = lr * root_bc2 / (1.0 - self.beta1_power)
        eps_term = eps * root_bc2
        # In the parameter's dtype: a float64 0-d array would promote a float32 parameter.
        self.terms = [
            (dtype, xp.astype(step_size, dtype, copy=False), xp.astype(eps_term, dtype, copy=False))
            for dtype in dtypes
        ]

    def terms_for(self, dtype: Any) -> tuple[Any, Any]:
        """This step's step size and eps term in ``dtype``."""
        for known, step_size, eps_term in self.terms:
            if known == dtype:
                return step_size, eps_term
        raise AssertionError(f"internal: no Adam step terms for {dtype} at this step")


def _fused_ops(xp: Any, array: Any, grad: Any, m: Any, v: Any) -> Extension | None:
    """The extension whose ``moment_update`` and ``adam_direction`` are one op each for this
    parameter: where the namespace has them, and the parameter, its gradient and moments are
    of one real floating dtype and one shape (else the chains go op by op)."""
    fused = find_extension(xp)
    has: Callable[[], bool] | None = getattr(fused, "has_optimizer_ops", None)
    if fused is None or has is None or not has():  # none: an extension made before them
        return None
    dtype, shape = array.dtype, array.shape
    for other in (grad, m, v):
        if other.dtype != dtype or other.shape != shape or not lives_with(other, array):
            return None
    return fused if xp.isdtype(dtype, "real floating") else None


def _widest_float(xp: Any, array: Any) -> Any:
    """float64 where ``array``'s device has it (else ``array``'s dtype): the bias powers'
    dtype, in which beta**t by repeated products stays exact to float64's precision over
    many steps, and the step size is computed, whatever the parameters' dtype."""
    floats = xp.__array_namespace_info__().dtypes(device=array.device, kind="real floating")
    return floats.get("float64", array.dtype)


def _copy_to(value: Any, array: Any, xp: Any) -> Any:
    """A new array with ``value``'s contents where ``array`` lives."""
    moved = follow(value, array, xp)
    return moved if moved is not value else xp.asarray(value, copy=True)
