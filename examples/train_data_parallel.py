"""Train train_mlp.py's digits classifier data-parallel: one replica per device, on several
Tensorwire servers (or several devices of one), with ``client.parallel.DataParallel``.

Each step's batch is cut into one shard per replica; each replica computes its shard's
gradients where it lives, a ring all-reduce (``x.to_device`` between the replicas' devices)
averages them, weighted by shard size, into the whole batch's, and every replica takes the
same Adam step, so the replicas stay bit-identical; the end checks that they are. One
replica gives exactly train_mlp.py's training, epoch for epoch.

    python examples/train_data_parallel.py --url ws://10.0.0.1:8765 --url ws://10.0.0.2:8765
    python examples/train_data_parallel.py --url ws://127.0.0.1:8765 --devices-per-server 2
    python examples/train_data_parallel.py --local --replicas 2     # numpy replicas

One ``--url`` per server (or ``remote:URL``); ``--devices-per-server N`` makes N replicas of
each, on its devices 0 to N-1 (a server started with ``--device ndarray:N``; a server's
devices sit next to each other in the ring, so only the hops between servers cross the
network). The servers pull the gradients' chunks from each other: start each with ``--peers``
naming the others (``--peers 'ws://10.0.0.*:8765'``). Each replica holds the whole training
set, uploaded once; a step uploads each replica's shard of row indices. The token:
``--token-file``, ``TENSOR_SERVER_TOKEN_FILE`` or ``TENSOR_SERVER_TOKEN``, the same for all.
Needs ``pip install -e '.[examples]'``, as train_mlp.py. Exit status 0 when the held-out
accuracy reaches 95% and the replicas are bit-identical, 1 otherwise, 2 when a server cannot be
reached or refuses us, a URL is not one, or the plot cannot be written (one line on stderr).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import checkpointing
import numpy as np
import running
from checkpointing import Checkpoints
from running import TOKEN_FILE_ENV
from train_mlp import GOAL, Curves, Saving, accuracy, digits, evaluate, mlp, plot

import client
from client import nn, optim
from client.autodiff import Autodiff, no_grad
from client.parallel import DataParallel, Replica


def train(
    spaces: Sequence[Autodiff],
    data: tuple[np.ndarray, ...],
    args: argparse.Namespace,
) -> tuple[DataParallel, Curves, float]:
    """train_mlp.py's training (the same model, seed, batches, Adam and cosine schedule) on
    ``len(spaces)`` replicas; also the seconds it took, held-out evaluations left out (each
    epoch's ends with a read from every replica, which waits for all of its steps) and
    checkpoints too. With --checkpoint, the first replica's state is saved (the replicas are
    identical) and --resume loads it into every replica (train_mlp.py's ``Saving``)."""
    x_train, y_train, x_test, y_test = data
    model = mlp(spaces[0], args.hidden, args.seed)
    dp = DataParallel(
        model,
        spaces,
        lambda ad: mlp(ad, args.hidden, args.seed),
        lambda params: optim.Adam(params, lr=args.lr),
    )
    order = np.random.default_rng(args.seed)
    rows = nn.DataLoader(x_train, batch_size=args.batch_size, shuffle=True, generator=order)
    per_epoch = len(rows)  # each batch's rows are cut into the replicas' shards by dp.step
    schedules = [optim.CosineAnnealingLR(o, T_max=args.epochs * per_epoch) for o in dp.optimizers]
    shared = [(ad.asarray(x_train), ad.asarray(y_train)) for ad in spaces]  # once per replica
    x_held, y_held = spaces[0].asarray(x_test), spaces[0].asarray(y_test)
    curves, seconds = Curves(), 0.0
    stats: list[list[Any]] = [[] for _ in spaces]  # per replica, per step: loss, accuracy
    replicas = [(r.model, r.optimizer, s) for r, s in zip(dp.replicas, schedules, strict=True)]
    saving = Saving(Checkpoints.of(args), replicas)
    first_epoch, first_batch = saving.resume(order, curves) if args.resume else (0, 0)

    def shard_loss(replica: Replica, rows: np.ndarray, *, total: int) -> Any:
        ad, (x, y) = replica.namespace, shared[replica.index]
        index = ad.asarray(rows)
        logits, labels = replica.model(ad.take(x, index, axis=0)), ad.take(y, index)
        loss = nn.cross_entropy(logits, labels)
        with no_grad():  # this shard's share of the batch's loss and accuracy, kept there
            both = ad.xp.stack([loss.array, accuracy(ad, logits, labels)])
            stats[replica.index].append(both * (len(rows) / total))
        return loss

    with running.progress(args.epochs * per_epoch, len(curves.loss), ("loss", "acc")) as advance:
        for epoch in range(first_epoch, args.epochs):
            start = time.perf_counter()
            at_start = order.bit_generator.state  # the epoch's order, for a checkpoint
            skipped = first_batch if epoch == first_epoch else 0
            batches = itertools.islice(rows.batch_indices(), skipped, None)
            for number, batch in enumerate(batches, start=skipped + 1):
                dp.step(partial(shard_loss, total=len(batch)), batch)
                for schedule in schedules:
                    schedule.step()
                if saving.checkpoints.due(len(curves.loss) + len(stats[0])):
                    _record(curves, stats, advance)  # the curves so far go in the checkpoint
                    seconds += time.perf_counter() - start
                    saving.save(curves, {"order": at_start, "epoch": epoch, "batch": number})
                    start = time.perf_counter()
            _record(curves, stats, advance)
            seconds += time.perf_counter() - start
            curves.held_out.append((len(curves.loss), evaluate(spaces[0], model, x_held, y_held)))
            mean_loss = np.mean(curves.loss[-per_epoch:])
            print(
                f"epoch {epoch + 1:3d}/{args.epochs}  loss {mean_loss:.4f}  held-out "
                f"accuracy {curves.held_out[-1][1]:.4f}",
                flush=True,
            )
    saving.save(curves, {"order": order.bit_generator.state, "epoch": args.epochs, "batch": 0})
    return dp, curves, seconds


def _record(curves: Curves, stats: list[list[Any]], advance: Any) -> None:
    """An epoch's per-step loss and accuracy: one read per replica, the shards' shares summed
    (``stats`` emptied for the next epoch; nothing when a checkpoint took them all)."""
    if not stats[0]:
        return
    shares = [np.asarray(r[0].__array_namespace__().stack(r), dtype=np.float64) for r in stats]
    for kept in stats:
        kept.clear()
    for loss, acc in sum(shares[1:], start=shares[0]):
        curves.loss.append(float(loss))
        curves.accuracy.append(float(acc))
        advance(float(loss), float(acc))


def _connect(stack: ExitStack, args: argparse.Namespace) -> tuple[list[Autodiff], str]:
    """One autodiff namespace per replica (numpy ones, or one per device of each server, in
    ring order), and where they are, in words."""
    if args.local:
        count = args.replicas
        return [Autodiff(np) for _ in range(count)], f"{count} numpy replica{'s' * (count > 1)}"
    token = running.token(args)
    devices = [
        stack.enter_context(client.RemoteDevice(url, index, token=token))
        for url in args.url
        for index in range(args.devices_per_server)
    ]
    names = [f"{dev.url} device {dev.index} (server {dev.server_id})" for dev in devices]
    return [Autodiff(client.namespace(dev)) for dev in devices], ", ".join(names)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=running.HELP_FORMAT
    )
    p.add_argument(
        "--url",
        action="append",
        help="a server, once per server (default: TENSORWIRE_URL or TENSOR_SERVER_URL, else "
        "ws://127.0.0.1:8765)",
    )
    p.add_argument(
        "--devices-per-server",
        type=int,
        default=1,
        metavar="N",
        help="a replica on each of devices 0..N-1 of each server",
    )
    p.add_argument("--token-file", default=None, help=f"file holding the token [{TOKEN_FILE_ENV}]")
    p.add_argument("--local", action="store_true", help="train numpy replicas instead")
    p.add_argument("--replicas", type=int, default=2, help="how many, with --local")
    p.add_argument("--epochs", type=int, default=20, help="passes over the training data")
    p.add_argument("--batch-size", type=int, default=64, help="the whole batch, all shards")
    p.add_argument("--hidden", type=int, default=128, help="units of the hidden layer")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the data order")
    running.add_out_flag(p)
    p.add_argument(
        "--plot",
        type=Path,
        default=Path("train_data_parallel.png"),
        help="PNG of the curves, in --out unless absolute",
    )
    checkpointing.add_flags(p)
    args = p.parse_args(argv)
    checkpointing.check_flags(p, args)
    if args.url is None:
        args.url = [running.URL]
    if min(args.devices_per_server, args.replicas) < 1:
        p.error("--devices-per-server and --replicas must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    unusable = running.place_outputs(args, "plot") or checkpointing.make_directory(args)
    if unusable is not None:  # before training, not after it
        return _fail(unusable)
    data = digits(args.seed)
    where = "locally on numpy" if args.local else ", ".join(args.url)
    try:
        with ExitStack() as stack:
            spaces, where = _connect(stack, args)
            print(f"training on {where}", flush=True)
            dp, curves, seconds = train(spaces, data, args)
            differing = dp.diverged()
    except (client.TensorwireError, ConnectionError, OSError, ValueError) as exc:
        return _fail(f"{where}: {type(exc).__name__}: {exc}")  # ValueError: a bad URL
    steps = len(curves.loss)
    print(f"{steps} steps in {seconds:.1f} s: {1e3 * seconds / steps:.2f} ms a step")
    final = curves.held_out[-1][1]
    print(f"held-out accuracy {final:.4f}")
    named = len(dict(dp.models[0].named_parameters()))
    same = f"no, {', '.join(differing)} differ" if differing else f"yes, all {named} parameters"
    print(f"replicas bit-identical: {same}")
    try:
        where = f"data-parallel on {len(spaces)} replicas"
        plot(curves, args.plot, f"MLP on scikit-learn's digits, trained {where}")
    except OSError as exc:
        return _fail(f"{args.plot}: {type(exc).__name__}: {exc}")
    return 0 if final >= GOAL and not differing else 1


def _fail(message: str) -> int:
    print(f"train_data_parallel.py: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
