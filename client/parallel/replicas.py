"""Replicas of one model and their training: :func:`replicate` copies a model's parameters
to other devices (``to_device``), and :class:`DataParallel` trains the copies on shards of each
batch, their gradients averaged by :func:`~client.parallel.ring.all_reduce_mean`, one flat
vector per replica and parameter dtype (usually one).

Why flat: a ring step moves one chunk per replica, each one ``to_device``, which between
servers costs a round trip (through the client today: a read and an upload; server to server:
an expose); a ring per parameter tensor would cost as many times more of them as the model
has tensors (6 for a three-layer MLP) for the same bytes. Flattening costs two ops per
tensor on each replica (a reshape in, a slice and a reshape out), sent without waiting.

``device.flush()`` is called where a device has one (a server's, queueing its ops until a
read): once a replica's backward pass is queued, so that its server computes while the next
replica's ops are built, and after its optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from client.autodiff import Autodiff, Tensor
from client.nn import Module
from client.optim import Optimizer

from .ring import all_reduce_mean


@dataclass(frozen=True)
class Replica:
    """One copy of the model: its position in the ring, its namespace, the model, its
    optimizer and the device its parameters live on (``to_device``'s target)."""

    index: int
    namespace: Autodiff
    model: Module
    optimizer: Optimizer
    device: Any


ShardLoss = Callable[[Replica, np.ndarray], Tensor]
"""``shard_loss(replica, shard)``: the mean loss of ``shard`` computed by ``replica.model``."""


class DataParallel:
    """``model`` replicated on each of ``namespaces`` (:func:`replicate`), each replica with
    its own ``optimizer(parameters)``, trained by :meth:`step` on shards of each batch.

    The replicas stay bit-identical as long as every change to their parameters goes through
    :meth:`step` (or :meth:`average_gradients`, then every optimizer's ``step()``) with the
    same hyper-parameters on every replica: the optimizers get the same bits of parameters,
    gradients and state, and their updates (``+ - * /``, ``sqrt``, casts: each rounded
    correctly by IEEE 754) give the same bits on any machine. Schedules go one per optimizer
    (``[CosineAnnealingLR(o, ...) for o in dp.optimizers]``), stepped together.

    Raises:
        ValueError, StateDictError: as :func:`replicate` raises them.
    """

    def __init__(
        self,
        model: Module,
        namespaces: Sequence[Autodiff],
        build: Callable[[Autodiff], Module],
        optimizer: Callable[[list[Tensor]], Optimizer],
    ) -> None:
        models = replicate(model, namespaces, build)
        self.replicas = [
            Replica(index, ad, made, optimizer(list(made.parameters())), _device_of(made))
            for index, (ad, made) in enumerate(zip(namespaces, models, strict=True))
        ]

    @property
    def models(self) -> list[Module]:
        return [replica.model for replica in self.replicas]

    @property
    def optimizers(self) -> list[Optimizer]:
        return [replica.optimizer for replica in self.replicas]

    def split(self, batch: np.ndarray) -> list[np.ndarray]:
        """``batch`` cut along its first axis into one shard per replica, in order: equal
        shards when the replica count divides its length, else the first ``len % N`` shards
        one row longer (``numpy.array_split``); :meth:`step` weights each shard's gradient
        by its length, so the average is still the whole batch's.

        Raises:
            ValueError: fewer rows than replicas (a replica would have an empty shard, whose
                mean loss is NaN).
        """
        count = len(self.replicas)
        if len(batch) < count:
            raise ValueError(
                f"a batch of {len(batch)} rows cannot be split among {count} replicas: "
                "each needs at least one row"
            )
        return np.array_split(batch, count)

    def step(self, shard_loss: ShardLoss, batch: np.ndarray) -> list[Tensor]:
        """One training step on ``batch``: each replica's optimizer clears its gradients,
        ``shard_loss(replica, shard)`` gives the mean loss of its shard (:meth:`split`) and
        its backward pass the shard's gradients; :meth:`average_gradients`, weighted by shard
        length, makes every replica's gradients those of the whole batch's mean loss; every
        optimizer steps. Returns each replica's shard loss (nothing is read)."""
        shards = self.split(batch)
        losses = []
        for replica, shard in zip(self.replicas, shards, strict=True):
            replica.optimizer.zero_grad()
            loss = shard_loss(replica, shard)
            loss.backward()
            losses.append(loss)
            _flush(replica.device)  # it computes while the next replica's ops are built
        self.average_gradients([len(shard) / len(batch) for shard in shards])
        for replica in self.replicas:
            replica.optimizer.step()
            _flush(replica.device)  # it updates while the caller prepares the next step
        return losses

    def average_gradients(self, weights: Sequence[float] | None = None) -> None:
        """Replace each replica's parameter gradients by their weighted sum over the replicas
        (``weights``, one per replica; 1/N each, the mean, by default): one
        :func:`all_reduce_mean` per parameter dtype, of the gradients flattened into one
        vector. A parameter without a gradient on some replica counts as zero there; one
        without a gradient on every replica keeps none (its optimizer skips it)."""
        named = [dict(replica.model.named_parameters()) for replica in self.replicas]
        trained = [
            name
            for name, param in named[0].items()
            if param.requires_grad and any(params[name].grad is not None for params in named)
        ]
        for names in _by_dtype(named[0], trained):
            pairs = list(zip(self.replicas, named, strict=True))
            flats = [
                _flatten(replica, params, names, _gradient_or_zeros) for replica, params in pairs
            ]
            for (replica, params), flat in zip(pairs, all_reduce_mean(flats, weights), strict=True):
                for name, part in _unflatten(replica, params, names, flat):
                    params[name].grad = part

    def diverged(self) -> list[str]:
        """The names of the parameters whose bits differ between replicas (empty when the
        replicas are identical): one read of every replica's parameters per dtype."""
        named = [dict(replica.model.named_parameters()) for replica in self.replicas]
        differing: list[str] = []
        for names in _by_dtype(named[0], list(named[0])):
            flats = [
                np.asarray(_flatten(r, p, names, _value))
                for r, p in zip(self.replicas, named, strict=True)
            ]
            offset = 0
            for name in names:
                end = offset + _size(named[0][name])
                first = flats[0][offset:end].tobytes()
                if any(flat[offset:end].tobytes() != first for flat in flats[1:]):
                    differing.append(name)
                offset = end
        return differing


def replicate(
    model: Module, namespaces: Sequence[Autodiff], build: Callable[[Autodiff], Module]
) -> list[Module]:
    """One model per namespace, each holding a copy of ``model``'s parameters.

    Replica 0 is ``model`` itself when it lives in ``namespaces[0]``; every other replica is
    made by ``build(namespace)`` (the same architecture; its own initial values are then
    replaced) and loaded with ``model``'s parameters moved by ``to_device`` (then copied there
    by ``load_state_dict``), so each replica starts from ``model``'s exact bits. ``model``'s
    arrays must be able to move to the replicas' devices: build it in ``namespaces[0]``.

    Raises:
        StateDictError: ``build`` made a model whose parameters do not match ``model``'s.
        ValueError: no namespaces, or a built model without parameters.
    """
    if not namespaces:
        raise ValueError("replicate: no namespaces to replicate the model to")
    source = model.state_dict()
    models = []
    for index, ad in enumerate(namespaces):
        if index == 0 and _lives_in(model, ad):
            models.append(model)
            continue
        replica = build(ad)
        device = _device_of(replica)
        replica.load_state_dict({name: array.to_device(device) for name, array in source.items()})
        models.append(replica)
    return models


def _size(param: Tensor) -> int:
    """How many elements ``param`` has (a parameter's shape is always known)."""
    return math.prod(int(n) for n in param.shape if n is not None)


def _lives_in(model: Module, ad: Autodiff) -> bool:
    return any(True for _ in model.parameters()) and model.namespace is ad


def _device_of(model: Module) -> Any:
    """Where ``model``'s parameters live (its first one's device)."""
    for param in model.parameters():
        return param.device
    raise ValueError(f"{type(model).__name__} has no parameters to replicate")


def _flush(device: Any) -> None:
    """Send the device's queued ops now, where it queues them (a server's device): its server
    starts on them instead of waiting for the first read. numpy's device has nothing to send."""
    flush = getattr(device, "flush", None)
    if callable(flush):
        flush()


def _by_dtype(params: dict[str, Tensor], names: list[str]) -> list[list[str]]:
    """``names`` grouped by their parameters' dtype, in order of first appearance: each group
    is one flat vector (a concatenation cannot mix dtypes without promoting)."""
    groups: list[tuple[Any, list[str]]] = []
    for name in names:
        dtype = params[name].dtype
        group = next((members for known, members in groups if known == dtype), None)
        if group is None:
            groups.append((dtype, [name]))
        else:
            group.append(name)
    return [members for _, members in groups]


def _gradient_or_zeros(replica: Replica, param: Tensor) -> Any:
    grad = param.grad
    if grad is not None:
        return grad.array
    xp = replica.namespace.xp
    return xp.zeros(param.shape, dtype=param.dtype, device=replica.device)


def _value(replica: Replica, param: Tensor) -> Any:
    return param.array


def _flatten(
    replica: Replica,
    params: dict[str, Tensor],
    names: list[str],
    array_of: Callable[[Replica, Tensor], Any],
) -> Any:
    """``array_of(replica, param)`` for each of ``names``, flattened and concatenated on the
    replica's device, in the order of ``names``."""
    xp = replica.namespace.xp
    return xp.concat([xp.reshape(array_of(replica, params[name]), (-1,)) for name in names])


def _unflatten(
    replica: Replica, params: dict[str, Tensor], names: list[str], flat: Any
) -> list[tuple[str, Any]]:
    """``flat`` cut back into arrays of the shapes of ``names``' parameters."""
    xp = replica.namespace.xp
    parts, offset = [], 0
    for name in names:
        shape = params[name].shape
        end = offset + _size(params[name])
        parts.append((name, xp.reshape(flat[offset:end], shape)))
        offset = end
    return parts
