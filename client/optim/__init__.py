"""Optimizers and learning-rate schedules over :mod:`client.autodiff` tensors, with PyTorch's
names and update rules: ``SGD`` (momentum, Nesterov, weight decay), ``Adam``, ``AdamW``,
``StepLR`` and ``CosineAnnealingLR``.

::

    opt = optim.AdamW(model.parameters(), lr=1e-3)
    schedule = optim.CosineAnnealingLR(opt, T_max=steps)
    for x, y in batches:
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()          # in-place ops where the parameters live: on the server
        schedule.step()

Their state is held where the parameters live (on the server for a remote model) and
updated in place, so a step sends a few ops per parameter and reads nothing back.
"""

from __future__ import annotations

from .adam import Adam as Adam
from .adam import AdamW as AdamW
from .optimizer import Optimizer as Optimizer
from .schedule import CosineAnnealingLR as CosineAnnealingLR
from .schedule import LRScheduler as LRScheduler
from .schedule import StepLR as StepLR
from .sgd import SGD as SGD
