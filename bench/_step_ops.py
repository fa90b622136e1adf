"""The ops of real training steps, recorded for ``python -m bench.cpu --kinds``: the digits
MLP of ``bench/training.py`` and the CNN and transformer of ``examples/`` (``bench/models.py``),
each trained a few steps on an in-process ``ndarray`` device (``client.local``, the server's
own session), every batch it ran kept as it was sent.

A :class:`Recording` replays its batches on a fresh :class:`~server.session.Session` up to the
measured step (the parameters, optimizer state and data in place), so that the step's batches,
or batches of one kind of its ops, can be timed on the state they really meet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import client
from client.autodiff import Autodiff
from client.local import LocalDevice
from protocol import CLIENT_ADAPTER, Batch, decode, encode
from protocol.ops import AnyOp
from server.session import Session

from . import models, training

Sent = tuple[Batch, list[bytes]]  # a batch and its buffers' bytes


def kind(op: AnyOp) -> str:
    """The op's kind as the table names it: its wire kind, and its name where it has one
    (``binary:matmul``, ``reduce:sum``, ``reshape``)."""
    name = op.name()
    return op.kind if name == op.kind else f"{op.kind}:{name}"


@dataclass
class Recording:
    """A model's batches, the measured step's from index ``step``."""

    model: str
    batches: list[Sent]
    step: int

    @property
    def step_batches(self) -> list[Sent]:
        return self.batches[self.step :]

    @property
    def step_ops(self) -> list[AnyOp]:
        return [op for batch, _ in self.step_batches for op in batch.ops]

    def session(self, through_step: bool = False) -> Session:
        """A fresh session with the batches before the step run (``through_step``: the step's
        too, without its frees, so that every tensor its ops read or wrote is there)."""
        session = Session("bench", 0)
        for batch, buffers in self.batches[: self.step]:
            run(session, batch, buffers)
        if through_step:
            for batch, buffers in self.step_batches:
                run(session, batch.model_copy(update={"frees": []}), buffers)
        return session


def run(session: Session, batch: Batch, buffers: Sequence[Any]) -> None:
    """``batch`` through ``session`` as the server runs a received one: inline as far as it
    goes, the rest as a worker thread would."""
    job = session.start(batch, buffers)
    while not session.step(job, True):
        session.step(job, False)
    session.finish(job)


def run_encoded(session: Session, message: bytes) -> None:
    """Decode ``message`` and run it (what ``bench.cpu`` times: decode + check + run)."""
    batch, buffers = decode(CLIENT_ADAPTER, message)
    run(session, batch, buffers)  # type: ignore[arg-type]


def encoded(batch: Batch, buffers: Sequence[bytes]) -> bytes:
    return b"".join(encode(batch, [memoryview(b) for b in buffers]))


def _recorded(train: Callable[[client.Device], Callable[[int], object]], model: str) -> Recording:
    """The batches of ``train(dev)(n)`` (n steps) on a local device: two steps, then the
    measured one."""
    batches: list[Sent] = []
    with LocalDevice() as dev:
        conn: Any = dev._conn  # noqa: SLF001 - the local session's runner, wrapped to record
        running = conn._run  # noqa: SLF001

        def recording(batch: Batch, buffers: list[memoryview]) -> Any:
            batches.append((batch, [bytes(b) for b in buffers]))
            return running(batch, buffers)

        conn._run = recording  # noqa: SLF001
        steps = train(dev)
        steps(2)
        first = len(batches)
        steps(1)
    return Recording(model, batches, first)


def _digits(dev: client.Device) -> Callable[[int], object]:
    trainer = training.Trainer(Autodiff(client.namespace(dev)), training.DIGITS, 4 * 64)
    return trainer.run


def _example(model: models.Model) -> Callable[[client.Device], Callable[[int], object]]:
    def train(dev: client.Device) -> Callable[[int], object]:
        return models.Contender(Autodiff(client.namespace(dev)), model, replayed=False).run

    return train


def recordings() -> list[Recording]:
    """One step of each training workload: the digits MLP, the CNN, the transformer."""
    return [
        _recorded(_digits, "digits MLP"),
        _recorded(_example(models.CNN), "CNN"),
        _recorded(_example(models.TRANSFORMER), "transformer"),
    ]
