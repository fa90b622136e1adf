"""Adam and AdamW: PyTorch's ``torch.optim.Adam`` (weight decay as L2, added to the gradient)
and ``torch.optim.AdamW`` (weight decay decoupled, applied to the parameter)."""

from __future__ import annotations

import math
from typing import Any

from client.autodiff import Tensor

from .optimizer import Optimizer, Params, check_nonnegative


class Adam(Optimizer):
    """Adam, as PyTorch's (without amsgrad), with ``g`` the gradient and ``t`` the step::

        g = g + weight_decay * p                       (Adam's L2; AdamW decays p instead)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    The bias corrections are Python floats, from a step count kept on the client per
    parameter; ``m`` (``exp_avg``) and ``v`` (``exp_avg_sq``) are arrays of the parameter's
    namespace, updated in place. Ops per parameter per step, each one message to a remote
    device: 12 (3 for m, 4 for v, 5 for p: ``sqrt``, ``+=`` eps, ``*``, ``/``, ``p -=``);
    +2 with Adam's weight decay, +1 with AdamW's; 2 more on the first step (the zeros).
    """

    _decoupled = False  # AdamW: weight decay applied to the parameter, not the gradient

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:  # fmt: skip
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

    def _update(self, param: Tensor, grad: Any, group: dict[str, Any],
                state: dict[str, Any]) -> None:  # fmt: skip
        # Python floats: a numpy float64 hyper-parameter would promote float32 arrays.
        lr, eps = float(group["lr"]), float(group["eps"])
        weight_decay = float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        if not state:
            xp = param.namespace.xp
            state.update(
                step=0, exp_avg=xp.zeros_like(param.array), exp_avg_sq=xp.zeros_like(param.array)
            )
        state["step"] += 1
        step = state["step"]
        g = grad  # never changed in place: it is the user's .grad
        if weight_decay != 0:
            if self._decoupled:
                param *= 1.0 - lr * weight_decay
            else:
                g = g + weight_decay * param.array
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += (1.0 - beta1) * g
        v *= beta2
        v += ((1.0 - beta2) * g) * g
        state["exp_avg"], state["exp_avg_sq"] = m, v
        # PyTorch's denominator sqrt(v) / sqrt(bc2) + eps, with sqrt(bc2) moved into the step
        # size: the same value, one op fewer (no array is divided by sqrt(bc2)).
        root_bc2 = math.sqrt(1.0 - beta2**step)
        step_size = lr * root_bc2 / (1.0 - beta1**step)
        denom = param.namespace.xp.sqrt(v)
        denom += eps * root_bc2
        param -= (step_size * m) / denom


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter), as PyTorch's: before the Adam
    step, ``p *= 1 - lr * weight_decay`` (one op), the gradient untouched. Its default
    ``weight_decay`` is 1e-2, PyTorch's."""

    _decoupled = True

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:  # fmt: skip
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
