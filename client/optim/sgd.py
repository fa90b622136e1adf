"""Stochastic gradient descent with momentum, Nesterov momentum and weight decay: PyTorch's
``torch.optim.SGD``, update for update."""

from __future__ import annotations

from typing import Any

from client.autodiff import Tensor

from .optimizer import Optimizer, Params, check_nonnegative


class SGD(Optimizer):
    """``p -= lr * g``, where, as in PyTorch (with ``g`` the gradient):

    - weight decay: ``g = g + weight_decay * p``;
    - momentum: ``buf = g`` on the first step, then ``buf = momentum * buf + (1 - dampening)
      * g``; ``g = g + momentum * buf`` with ``nesterov``, else ``g = buf``.

    The momentum buffer is an array of the parameter's namespace (on the server for a remote
    parameter), updated in place; ``lr`` is the group's 0-d array of the gradient's dtype
    there (:meth:`Optimizer.lr_array`). Ops per parameter per step, each one message to a
    remote device: 2 (``lr * g``, ``p -=``); +2 with weight decay; +2 with momentum
    (``buf *=``, ``buf +=``; the first step ``zeros_like``, ``buf +=``), +1 more with
    dampening; +2 more with Nesterov. None per group, but the first step's ``full`` for each
    learning-rate array.
    """

    def __init__(
        self,
        params: Params,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        check_nonnegative(lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                "Nesterov momentum needs momentum > 0 and dampening == 0, got "
                f"momentum={momentum}, dampening={dampening}"
            )
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
        }
        super().__init__(params, defaults)

    def _update(
        self, param: Tensor, grad: Any, group: dict[str, Any], state: dict[str, Any]
    ) -> None:
        # Python floats: a numpy float64 hyper-parameter would promote float32 arrays.
        momentum, xp = float(group["momentum"]), param.namespace.xp
        dampening, weight_decay = float(group["dampening"]), float(group["weight_decay"])
        g = grad  # never changed in place: it is the user's .grad
        if weight_decay != 0:
            g = g + weight_decay * param.array
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:  # buf = g, as a new array of its own (g may be the user's .grad)
                buf = xp.zeros_like(param.array)
                buf += g
            else:
                buf *= momentum
                buf += g if dampening == 0 else (1.0 - dampening) * g
            state["momentum_buffer"] = buf
            g = g + momentum * buf if group["nesterov"] else buf
        lr = self.lr_array(group, xp, param.array, g.dtype)  # the float's value in g's dtype
        param -= lr * g  # in place on the tensor: the same array, its version bumped
