"""A small training loop on a Tensorwire server: linear regression by gradient descent.

Every array lives on the server; each step sends a handful of ops and reads back one number
(the loss), which is how real training code talks to a remote device.

    python examples/train.py --url ws://127.0.0.1:8765             # token: TENSOR_SERVER_TOKEN
    python examples/train.py --token-file ./token --plot loss.png  # or TENSOR_SERVER_TOKEN_FILE

``--checkpoint DIR`` saves the weights and the losses so far every ``--checkpoint-every N``
steps and at the end; ``--resume`` goes on from the latest there (on a restarted server, say),
ending exactly as a run never interrupted. ``--plot`` draws the loss curve with matplotlib
(``pip install -e '.[examples]'``); without matplotlib the curve is skipped with a note. Exit
status 0 when the loss fell by at least 100x and the weights were recovered, 1 otherwise, 2
when the server cannot be reached or refuses us, or a checkpoint cannot be used (one line on
stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import checkpointing
import numpy as np
import running
from checkpointing import Checkpoints

import client
from client import checkpoint

TOKEN_FILE_ENV = "TENSOR_SERVER_TOKEN_FILE"  # noqa: S105 - the variable's name, not a token


def make_data(
    rng: np.random.Generator, n: int, d: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs ``x`` (n, d), true weights (d, 1) and targets ``y = x @ w + 0.5 + noise``."""
    x = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.uniform(-2, 2, (d, 1)).astype(np.float32)
    y = x @ w + 0.5 + rng.normal(0, 0.01, (n, 1)).astype(np.float32)
    return x, w, y.astype(np.float32)


def train(
    xp: client.Namespace,
    x_np: np.ndarray,
    y_np: np.ndarray,
    args: argparse.Namespace,
) -> tuple[list[float], np.ndarray, float]:
    """Fit ``y ~ x @ w + b`` on the server; returns the loss of every step, ``w`` and ``b``.

    With --checkpoint, ``w``, ``b`` and the losses so far are saved every N steps and at the
    end, and --resume goes on from the latest (``checkpointing``); the steps are full-batch
    gradient descent, with no data order to keep."""
    n, d = x_np.shape
    x, y = xp.asarray(x_np), xp.asarray(y_np)
    w = xp.zeros((d, 1), dtype=xp.float32)
    b = xp.zeros((1,), dtype=xp.float32)
    losses: list[float] = []
    checkpoints = Checkpoints.of(args)
    if args.resume and (path := checkpoints.latest()) is not None:
        info = checkpoint.load(path)
        w, b = xp.asarray(info.arrays["w"]), xp.asarray(info.arrays["b"])
        losses = [float(loss) for loss in info.extra["losses"]]
        checkpoints.resumed(info)
    report_every = max(1, args.steps // 10)
    for step in range(len(losses), args.steps):
        err = x @ w + b - y  # (n, 1), computed on the server
        loss = xp.mean(err * err)
        w = w - args.lr * (2.0 / n) * (x.T @ err)
        b = b - args.lr * 2.0 * xp.mean(err, axis=0)
        losses.append(float(loss))  # the one round trip of the step
        if step % report_every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.6f}", flush=True)
        if checkpoints.due(len(losses)):
            checkpoints.save(len(losses), model={"w": w, "b": b}, extra={"losses": losses})
    checkpoints.save(len(losses), model={"w": w, "b": b}, extra={"losses": losses})
    return losses, w.numpy(), float(b[0])


def plot(losses: list[float], path: Path) -> None:
    """Write the loss curve to ``path`` (PNG), or say why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[examples]')")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(losses)
    ax.set_xlabel("step")
    ax.set_ylabel("mean squared error")
    ax.set_title("linear regression on a Tensorwire server")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"loss curve written to {path}")


def _token(args: argparse.Namespace) -> str | None:
    path = args.token_file or os.environ.get(TOKEN_FILE_ENV)
    return Path(path).read_text().strip() if path else None  # None: TENSOR_SERVER_TOKEN


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=running.HELP_FORMAT
    )
    p.add_argument(
        "--url",
        default=running.URL,
        help="the server; TENSORWIRE_URL or TENSOR_SERVER_URL sets the default",
    )
    p.add_argument("--token-file", default=None, help=f"file holding the token [{TOKEN_FILE_ENV}]")
    p.add_argument("--steps", type=int, default=300, help="gradient descent steps")
    p.add_argument("--samples", type=int, default=4096, help="rows of the synthetic data")
    p.add_argument("--features", type=int, default=16, help="columns of the synthetic data")
    p.add_argument("--lr", type=float, default=0.1, help="the learning rate")
    p.add_argument("--quick", action="store_true", help="a few steps on little data (for tests)")
    running.add_out_flag(p)
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write the loss curve to this PNG, in --out unless absolute (default: no plot)",
    )
    checkpointing.add_flags(p)
    args = p.parse_args(argv)
    checkpointing.check_flags(p, args)
    if args.quick:
        args.steps, args.samples, args.features = 60, 256, 4
    unusable = running.place_outputs(args, "plot") or checkpointing.make_directory(args)
    if unusable is not None:
        print(f"train.py: {unusable}", file=sys.stderr)
        return 2
    x, w_true, y = make_data(np.random.default_rng(0), args.samples, args.features)
    try:
        with client.RemoteDevice(args.url, token=_token(args)) as dev:
            print(f"training on {dev.url} (server {dev.server_id})", flush=True)
            xp = client.namespace(dev)
            losses, w, b = train(xp, x, y, args)
    except (client.TensorwireError, ConnectionError, OSError, ValueError) as exc:
        print(f"train.py: {args.url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    error = float(np.max(np.abs(w - w_true)))
    print(f"final loss {losses[-1]:.6f} (from {losses[0]:.4f}); ", end="")
    print(f"max weight error {error:.4f}; b {b:.4f}")
    if args.plot is not None:
        plot(losses, args.plot)
    ok = losses[-1] * 100 <= losses[0] and error < 0.05
    print("converged" if ok else "did not converge")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
