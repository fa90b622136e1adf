"""Learning-rate schedules: ``StepLR`` and ``CosineAnnealingLR``, PyTorch's closed forms.

A scheduler computes each group's rate on the client and sets it with
:meth:`Optimizer.set_lr`: ``group["lr"]``, and the group's 0-d learning-rate arrays where its
parameters live, written in place (two ops per array on a remote device, none while the rate
stays the same). The optimizer's update ops read those arrays, not the float (tinygrad's
design: the rate is a device tensor and schedules assign into it), so a step sends the same
ops whatever the rate, and a step recorded once (``client.capture.jit``) and replayed by id
uses the rate of each step, as running it would, bit for bit. Call ``schedule.step()``
between steps, outside the jitted function: its writes are ops of their own, and a replay
runs no Python. Assigning ``group["lr"]`` directly works without a recorded step (the
optimizer's next ``step()`` writes it) but not under replay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .optimizer import Optimizer


class LRScheduler:
    """The base: ``step()`` once per epoch (or per batch), after ``optimizer.step()``.

    Built, it records each group's ``"initial_lr"`` (as PyTorch's, so a second scheduler on
    the same optimizer starts from the same base) and sets the rate of step 0.
    A subclass defines ``lr_at(base_lr, step)``: its closed form.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs: list[float] = [float(g["initial_lr"]) for g in optimizer.param_groups]
        self.last_epoch = -1
        self._last_lr: list[float] = []
        self.step()

    _own: tuple[str, ...] = ()  # the subclass's parameters, in its state dict

    def lr_at(self, base_lr: float, step: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no lr_at()")

    def get_lr(self) -> list[float]:
        """The rates of every group at the current step."""
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    def step(self) -> None:
        """Advance one step and set the new rates in the optimizer's groups, on the client
        and on the devices (:meth:`Optimizer.set_lr`)."""
        self.last_epoch += 1
        rates = self.get_lr()
        for index, (_, rate) in enumerate(zip(self.optimizer.param_groups, rates, strict=True)):
            self.optimizer.set_lr(rate, group_index=index)
        self._last_lr = rates

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout: the scheduler's attributes but the optimizer (``base_lrs``,
        ``last_epoch``, ``_last_lr``, ``_step_count``, the schedule's own such as ``T_max``),
        plain Python values. The rates themselves are in the optimizer's state dict."""
        state = {key: value for key, value in vars(self).items() if key != "optimizer"}
        return {
            **state,
            "base_lrs": list(self.base_lrs),
            "_last_lr": list(self._last_lr),
            "_step_count": self.last_epoch + 1,  # step() calls, the one at construction too
            "_get_lr_called_within_step": False,
            "_is_initial": False,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take the position and parameters of ``state_dict`` (from :meth:`state_dict`, or
        PyTorch's), setting no rate: the optimizer's own state dict holds those.

        Raises:
            ValueError: a key it needs is missing, or ``base_lrs`` has another group count.
        """
        missing = [key for key in ("base_lrs", "last_epoch", *self._own) if key not in state_dict]
        if missing:
            raise ValueError(f"{type(self).__name__} state dict lacks {missing}")
        base_lrs = [float(rate) for rate in state_dict["base_lrs"]]
        if len(base_lrs) != len(self.optimizer.param_groups):
            raise ValueError(
                f"the state dict has {len(base_lrs)} base rates, the optimizer "
                f"{len(self.optimizer.param_groups)} parameter groups"
            )
        for key in self._own:
            setattr(self, key, type(getattr(self, key))(state_dict[key]))
        self.base_lrs, self.last_epoch = base_lrs, int(state_dict["last_epoch"])
        self._last_lr = [float(rate) for rate in state_dict.get("_last_lr", self.get_lr())]

    def get_last_lr(self) -> list[float]:
        """The rates the last ``step()`` set, one per group."""
        return list(self._last_lr)


class StepLR(LRScheduler):
    """``base_lr * gamma ** (step // step_size)``: the rate divided every ``step_size``
    steps."""

    _own = ("step_size", "gamma")

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1) -> None:
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2``: from the base
    rate down to ``eta_min`` over ``T_max`` steps along half a cosine (and back up after, as
    PyTorch's closed form)."""

    _own = ("T_max", "eta_min")

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0) -> None:  # noqa: N803
        if T_max < 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, step: int) -> float:
        cosine = (1.0 + math.cos(math.pi * step / self.T_max)) / 2.0
        return self.eta_min + (base_lr - self.eta_min) * cosine
