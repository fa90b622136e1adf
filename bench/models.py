"""The models workload: one training step of the CNN of ``examples/train_cnn.py`` and one of
the transformer of ``examples/train_transformer.py``, each op by op and replayed
(``client.capture.jit``) on the server, against local numpy in the same run, as steps per
second.

The steps, models and data are the examples' own, at their default sizes, imported from
``examples/``: the CNN's step is ``train_mlp.classifier_step`` (gather a batch of 64 digits
from uploaded indices, forward with batch norm and dropout, cross-entropy, backward, Adam, the
loss and accuracy returned in one array), the transformer's is
``train_transformer.training_step`` (gather 32 windows of 33 characters of Python's
documentation, resident on the device, forward through two blocks of causal attention and MLP
with dropout, cross-entropy, backward, AdamW, the loss returned). Each step reads its loss;
its batch is drawn at random.

Each contender trains its own copy of the model, on its own session (a namespace has one
random generator: two contenders on one would share its draws): op by op on the run's
session, replayed on a second one, and on numpy. All three are seeded alike
(``nn.manual_seed`` in the examples' builders), so they train identically, loss for loss, and
the workload checks that they do. Their rounds are interleaved, so all see the same machine.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import client
from client import optim
from client.autodiff import Autodiff
from client.capture import jit

from ._report import Figure, Goal, Stat

Tick = Callable[[], None]
Step = Callable[[Any], Any]
Batches = Callable[[np.random.Generator], np.ndarray]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GOAL = Goal(">=", 0.9)


def _example(name: str) -> ModuleType:
    """``examples/NAME.py`` as a module (it imports its neighbours as a script does)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


def _cnn(ad: Autodiff) -> tuple[Step, Batches]:
    train_cnn, train_mlp = _example("train_cnn"), _example("train_mlp")
    args = train_cnn.parse([])
    model = train_cnn.cnn(ad, args.seed, args.dropout)
    images, labels, _, _ = train_mlp.digits(args.seed)
    x, y = ad.asarray(images.reshape(-1, 1, 8, 8)), ad.asarray(labels)
    opt = optim.Adam(model.parameters(), lr=args.lr)
    classify = train_mlp.classifier_step(ad, model, opt)

    def step(index: Any) -> Any:  # the batch gathered on the device, as nn.DataLoader does
        return classify(ad.take(x, index, axis=0), ad.take(y, index))

    return step, lambda order: order.integers(0, len(labels), args.batch_size)


def _transformer(ad: Autodiff) -> tuple[Step, Batches]:
    example = _example("train_transformer")
    args = example.parse([])
    text = example.documentation()
    model = example.transformer(ad, len(text.alphabet), args)
    codes = ad.asarray(text.train)
    step = example.training_step(model, example.optimizer(model, args), codes, args.context)
    last = len(text.train) - args.context - 1
    return step, lambda order: order.integers(0, last + 1, args.batch_size)


@dataclass(frozen=True)
class Model:
    title: str
    build: Callable[[Autodiff], tuple[Step, Batches]]
    loss: Callable[[Any], float]  # the loss, read from what the step returns


CNN = Model(
    "CNN of train_cnn.py, batch 64, Adam",
    _cnn,
    lambda both: float(np.asarray(both)[0]),  # [loss, accuracy]
)
TRANSFORMER = Model(
    "transformer of train_transformer.py, batch 32 x 32, AdamW",
    _transformer,
    float,
)


class Contender:
    """One copy of the model training on one namespace, its step op by op or replayed."""

    def __init__(self, ad: Autodiff, model: Model, replayed: bool) -> None:
        step, self.batches = model.build(ad)
        self.step = jit(step) if replayed else step
        self.ad, self.read = ad, model.loss
        self.order = np.random.default_rng(2)
        self.losses: list[float] = []

    def run(self, steps: int) -> float:
        """Train ``steps`` steps, reading each loss: seconds per step."""
        start = time.perf_counter()
        for _ in range(steps):
            out = self.step(self.ad.asarray(self.batches(self.order)))
            self.losses.append(self.read(out))
        return (time.perf_counter() - start) / steps


def steps(
    dev: client.RemoteDevice, url: str, model: Model, count: int, reps: int, tick: Tick
) -> list[Figure]:
    """``model``'s step op by op on ``dev`` and replayed on a second session of the server at
    ``url``, against local numpy: ``reps`` interleaved rounds of ``count`` steps each, after
    three untimed steps (warm-up, record, first replay)."""
    with client.RemoteDevice(url) as second:
        contenders = {
            "op by op": Contender(Autodiff(client.namespace(dev)), model, replayed=False),
            "replayed": Contender(Autodiff(client.namespace(second)), model, replayed=True),
            "local numpy": Contender(Autodiff(np), model, replayed=False),
        }
        for contender in contenders.values():
            contender.run(3)
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(reps):
            for name, contender in contenders.items():
                rates[name].append(1 / contender.run(count))
            tick()
    direct, replayed, local = (c.losses for c in contenders.values())
    if not direct == replayed == local:
        raise AssertionError(f"{model.title}: the three trained differently")
    stats = {name: Stat.of(rate, "steps/s") for name, rate in rates.items()}
    reference = stats["local numpy"]
    name = f"training step: {model.title}"
    return [
        Figure(
            name,
            f"{way} steps/s / local numpy",
            stats[way].median / reference.median,
            GOAL if way == "replayed" else None,
            stats[way],
            reference,
            "local numpy",
        )
        for way in ("replayed", "op by op")
    ]
