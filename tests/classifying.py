"""One training step of the small classifiers the tests train (cross-entropy, a backward
pass, an optimizer step), shared so that every test trains the same way."""

from __future__ import annotations

from typing import Any

from client import nn


def classifier_step(ad: Any, net: Any, opt: Any, x: Any, y: Any, index: Any) -> Any:
    """Train ``net`` with ``opt`` for one step on the rows ``index`` of ``x`` and ``y``
    (arrays of autodiff ``ad``); the step's loss."""
    loss = nn.cross_entropy(net(ad.take(x, index, axis=0)), ad.take(y, index))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
