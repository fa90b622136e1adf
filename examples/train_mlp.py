"""Train an MLP classifier on scikit-learn's handwritten digits on a Tensorwire server.

The model, its gradients and Adam's state live on the server; each step uploads the indices
of its batch, which ``nn.DataLoader`` gathers there (the data was uploaded once), and reads
back two numbers, the batch's loss and accuracy, for the progress bar. ``--local`` runs the
same code on numpy, for comparison.

    python examples/train_mlp.py --url ws://127.0.0.1:8765      # token: TENSOR_SERVER_TOKEN
    python examples/train_mlp.py --token-file ./token --plot curves.png
    python examples/train_mlp.py --local
    python examples/train_mlp.py --jit      # the step recorded once, then one op per step
    python examples/train_mlp.py --checkpoint ckpt [--resume]   # survive a server restart

Needs scikit-learn (the digits ship with it: no download), rich (the progress bar) and
matplotlib (the curves): ``pip install -e '.[examples]'``. Exit status 0 when the held-out
accuracy reaches 95%, 1 otherwise, 2 when the server cannot be reached or refuses us, the URL
is not one, or an output file cannot be written (one line on stderr).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import checkpointing
import numpy as np
import running
from checkpointing import Checkpoints

from client import checkpoint, nn, optim
from client.autodiff import Autodiff, no_grad
from client.capture import jit

GOAL = 0.95


@dataclass
class Curves:
    """What training measured: per step, and held-out per epoch."""

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    held_out: list[tuple[int, float]] = field(default_factory=list)  # (step, accuracy)


@dataclass
class Saving:
    """--checkpoint: the whole training state every ``every`` steps and at the end, and
    --resume from the latest (``checkpointing``). With the model's, Adam's and the schedule's
    state, a checkpoint holds where the data order was (the generator's state at the epoch's
    start and the batches done) and the curves so far, so a resumed run is the uninterrupted
    one, bit for bit. ``replicas``: each copy's model, optimizer and schedule (identical
    copies: train_data_parallel.py's); a checkpoint holds the first's, a resume loads it into
    every one."""

    checkpoints: Checkpoints
    replicas: list[tuple[nn.Module, optim.Optimizer, optim.LRScheduler]]

    def resume(self, order: np.random.Generator, curves: Curves) -> tuple[int, int]:
        """Load the latest checkpoint, if any: the epoch and batch to go on from."""
        path = self.checkpoints.latest()
        if path is None:
            return 0, 0
        for model, opt, schedule in self.replicas:
            info = checkpoint.load(path, model=model, optimizer=opt, scheduler=schedule)
        where = info.extra["data"]
        order.bit_generator.state = where["order"]
        saved = info.extra["curves"]
        curves.loss[:], curves.accuracy[:] = saved["loss"], saved["accuracy"]
        curves.held_out[:] = [(int(step), float(acc)) for step, acc in saved["held_out"]]
        self.checkpoints.resumed(info)
        return int(where["epoch"]), int(where["batch"])

    def save(self, curves: Curves, data: dict[str, Any]) -> None:
        """Step ``len(curves.loss)``'s checkpoint (nothing without --checkpoint)."""
        model, opt, schedule = self.replicas[0]
        self.checkpoints.save(
            len(curves.loss),
            model=model,
            optimizer=opt,
            scheduler=schedule,
            extra={"data": data, "curves": asdict(curves)},
        )


@dataclass(frozen=True)
class Classifier:
    """A digits classifier as a script trains it: the script's name (on its error lines), the
    model's (in the plot's title), the shape of one input (the 64 pixels as they are, or an
    image), how to build the model on a namespace, and the held-out accuracy to reach."""

    script: str
    model: str
    shape: tuple[int, ...]
    build: Callable[[Autodiff], nn.Module]
    goal: float


def digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits scaled to [0, 1]: train and held-out inputs and labels."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]

    x, y = load_digits(return_X_y=True)
    split = train_test_split(
        (x / 16.0).astype(np.float32),
        y.astype(np.int64),
        test_size=0.2,
        random_state=seed,
        stratify=y,
    )
    x_train, x_test, y_train, y_test = split
    return x_train, y_train, x_test, y_test


def mlp(ad: Autodiff, hidden: int, seed: int) -> nn.Module:
    """64 pixels -> ``hidden`` -> ``hidden`` -> 10 classes, initialised on the client."""
    rng = np.random.default_rng(seed)
    return nn.Sequential(
        nn.Linear(64, hidden, ad=ad, rng=rng),
        nn.ReLU(),
        nn.Linear(hidden, hidden, ad=ad, rng=rng),
        nn.ReLU(),
        nn.Linear(hidden, 10, ad=ad, rng=rng),
    )


def accuracy(ad: Autodiff, logits: Any, labels: Any) -> Any:
    """The share of rows whose largest logit is the label's (an array: nothing is read)."""
    hits = ad.xp.argmax(logits.array, axis=1) == labels.array
    return ad.xp.mean(ad.xp.astype(hits, ad.xp.float32))


def classifier_step(
    ad: Autodiff, model: nn.Module, opt: optim.Optimizer
) -> Callable[[Any, Any], Any]:
    """The training step on a batch of inputs and labels (gathered on the device): forward,
    cross-entropy, backward, ``opt``'s update; it returns the batch's loss and accuracy in
    one array, for one read."""

    def step(inputs: Any, labels: Any) -> Any:
        logits = model(inputs)
        loss = nn.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with no_grad():
            return ad.xp.stack([loss.array, accuracy(ad, logits, labels)])

    return step


def train(
    ad: Autodiff,
    model: nn.Module,
    data: tuple[np.ndarray, ...],
    args: argparse.Namespace,
) -> Curves:
    """Adam with a cosine schedule, ``args.epochs`` epochs of shuffled batches."""
    x_train, y_train, x_test, y_test = data
    x, y = ad.asarray(x_train), ad.asarray(y_train)  # uploaded once; batches are gathered there
    x_held, y_held = ad.asarray(x_test), ad.asarray(y_test)
    order = np.random.default_rng(args.seed)
    batches = nn.DataLoader(x, y, batch_size=args.batch_size, shuffle=True, generator=order)
    per_epoch = len(batches)
    opt = optim.Adam(model.parameters(), lr=args.lr)
    schedule = optim.CosineAnnealingLR(opt, T_max=args.epochs * per_epoch)
    curves = Curves()
    saving = Saving(Checkpoints.of(args), [(model, opt, schedule)])
    first_epoch, first_batch = saving.resume(order, curves) if args.resume else (0, 0)

    step = classifier_step(ad, model, opt)
    # --jit: the step is recorded once and then runs on the server as one op (the schedule
    # writes its rate into the optimizer's device arrays between steps; on numpy jit just runs)
    run_step = jit(step) if args.jit else step
    with running.progress(args.epochs * per_epoch, len(curves.loss), ("loss", "acc")) as advance:
        for epoch in range(first_epoch, args.epochs):
            at_start = order.bit_generator.state  # the epoch's order, for a checkpoint
            skipped = first_batch if epoch == first_epoch else 0
            epoch_batches = itertools.islice(batches, skipped, None)  # drawn from `order`
            for number, (x_batch, y_batch) in enumerate(epoch_batches, start=skipped + 1):
                both = run_step(x_batch, y_batch)
                schedule.step()
                step_loss, step_accuracy = (float(v) for v in np.asarray(both))
                curves.loss.append(step_loss)
                curves.accuracy.append(step_accuracy)
                advance(step_loss, step_accuracy)
                if saving.checkpoints.due(len(curves.loss)):
                    saving.save(curves, {"order": at_start, "epoch": epoch, "batch": number})
            curves.held_out.append((len(curves.loss), evaluate(ad, model, x_held, y_held)))
            mean_loss = np.mean(curves.loss[-per_epoch:])
            print(
                f"epoch {epoch + 1:3d}/{args.epochs}  loss {mean_loss:.4f}  held-out "
                f"accuracy {curves.held_out[-1][1]:.4f}",
                flush=True,
            )
    saving.save(curves, {"order": order.bit_generator.state, "epoch": args.epochs, "batch": 0})
    return curves


def evaluate(ad: Autodiff, model: nn.Module, x: Any, y: Any) -> float:
    model.eval()
    with no_grad():
        held_out = float(accuracy(ad, model(x), y))
    model.train()
    return held_out


def plot(curves: Curves, path: Path, title: str) -> None:
    """The loss and accuracy curves as a PNG, or say why not."""
    plt = running.pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    steps = np.arange(1, len(curves.loss) + 1)
    left.plot(steps, curves.loss, lw=0.6, alpha=0.5, label="batch")
    left.plot(steps, running.smooth(curves.loss), label="moving average")
    left.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="loss")
    left.legend()
    right.plot(steps, running.smooth(curves.accuracy), label="batch (moving average)")
    right.plot(*zip(*curves.held_out, strict=True), "o-", label="held-out")
    right.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="accuracy")
    right.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"curves written to {path}")


def _save(model: nn.Module, path: Path | None) -> None:
    if path is not None:
        model.save(path)
        print(f"weights written to {path} (safetensors)")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = running.parser(
        __doc__.splitlines()[0], epochs=20, batch_size=64, lr=3e-3, plot="train_mlp.png"
    )
    p.add_argument("--hidden", type=int, default=128, help="units of the hidden layer")
    p.add_argument("--quick", action="store_true", help="a few epochs (for tests)")
    checkpointing.add_flags(p)
    args = p.parse_args(argv)
    checkpointing.check_flags(p, args)
    if args.quick:
        args.epochs = 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    build = partial(mlp, hidden=args.hidden, seed=args.seed)
    return run(args, Classifier("train_mlp.py", "MLP", (64,), build, GOAL))


def run(args: argparse.Namespace, classifier: Classifier) -> int:
    """Train ``classifier`` as the flags say, save and plot it: the exit status (0: the
    held-out accuracy reached the goal, 1: it did not, 2: training could not run or an
    output could not be written, said in one line on stderr)."""
    unusable = running.place_outputs(args, "plot", "save") or checkpointing.make_directory(args)
    if unusable is not None:
        return _fail(classifier.script, unusable)
    x_train, y_train, x_test, y_test = digits(args.seed)
    shape = (-1, *classifier.shape)
    data = (x_train.reshape(shape), y_train, x_test.reshape(shape), y_test)
    start = time.perf_counter()

    def work(ad: Autodiff) -> Curves:
        model = classifier.build(ad)
        curves = train(ad, model, data, args)
        _save(model, args.save)  # read from the server while it is connected
        return curves

    try:
        curves, where = running.on_device(args, work)
    except running.Unusable as exc:
        return _fail(classifier.script, str(exc))
    seconds = time.perf_counter() - start
    final = curves.held_out[-1][1]
    print(f"{len(curves.loss)} steps in {seconds:.1f} s ({len(curves.loss) / seconds:.0f}/s)")
    print(f"held-out accuracy {final:.4f}")
    try:
        plot(curves, args.plot, f"{classifier.model} on scikit-learn's digits, trained {where}")
    except OSError as exc:
        return _fail(classifier.script, f"{args.plot}: {type(exc).__name__}: {exc}")
    return 0 if final >= classifier.goal else 1


def _fail(script: str, message: str) -> int:
    print(f"{script}: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
