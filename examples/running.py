"""What the training examples share: the flags that say where to train (``--url``,
``--token-file``, ``--local``, ``--jit``) and where outputs go (``--out``), opening the device
they name, the progress bar and the moving average of a curve.

A script adds :func:`add_device_flags` to its parser and runs its training through
:func:`on_device`, which opens the server (or numpy's namespace), says where it trains on the
first line of stdout, and turns what stops a run before or while it talks to the server (a
refusal, a lost connection, a URL that is not one) into :class:`Unusable`: one line for
stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import client
from client.autodiff import Autodiff

TOKEN_FILE_ENV = "TENSOR_SERVER_TOKEN_FILE"  # noqa: S105 - the variable's name, not a token
# the server: --url, else TENSORWIRE_URL (as client.RemoteDevice reads it), else the older
# TENSOR_SERVER_URL, else the server's default address
URL = (
    os.environ.get("TENSORWIRE_URL") or os.environ.get("TENSOR_SERVER_URL") or "ws://127.0.0.1:8765"
)
# where plots and weights go unless --out says: a directory of the system's temporary one, so
# that a run writes nothing into the directory it was started from
OUT = Path(tempfile.gettempdir()) / "tensorwire-examples"
HELP_FORMAT = argparse.ArgumentDefaultsHelpFormatter  # --help shows every flag's default
T = TypeVar("T")


class Unusable(Exception):
    """Training could not run where the flags said: the message is one line, for stderr."""


def add_device_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=URL,
        help="the server; TENSORWIRE_URL or TENSOR_SERVER_URL sets the default",
    )
    p.add_argument(
        "--token-file",
        default=None,
        help=f"file holding the token [{TOKEN_FILE_ENV}; else the client reads TENSORWIRE_TOKEN, "
        "TENSORWIRE_TOKEN_FILE or TENSOR_SERVER_TOKEN]",
    )
    p.add_argument("--local", action="store_true", help="train on numpy instead of a server")
    p.add_argument(
        "--jit",
        action="store_true",
        help="record the step once, then run it by id (client.capture.jit)",
    )


def parser(
    description: str, *, epochs: int, batch_size: int, lr: float, plot: str
) -> argparse.ArgumentParser:
    """The flags every training example has: where (:func:`add_device_flags`), how long and
    how fast (``--epochs``, ``--batch-size``, ``--lr``, ``--seed``), and its outputs
    (``--plot``, ``--save``); the defaults are the script's."""
    p = argparse.ArgumentParser(description=description, formatter_class=HELP_FORMAT)
    add_device_flags(p)
    p.add_argument("--epochs", type=int, default=epochs, help="passes over the training data")
    p.add_argument("--batch-size", type=int, default=batch_size, help="examples a step")
    p.add_argument("--lr", type=float, default=lr, help="the optimizer's learning rate")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the data order")
    add_out_flag(p)
    p.add_argument(
        "--plot", type=Path, default=Path(plot), help="PNG of the curves, in --out unless absolute"
    )
    p.add_argument(
        "--save",
        type=Path,
        default=None,
        help="write the weights (safetensors) to this file, in --out unless absolute",
    )
    return p


def add_out_flag(p: argparse.ArgumentParser) -> None:
    """``--out DIR`` and ``--version``: what every example has beside its own flags."""
    p.add_argument("--version", action="version", version=f"%(prog)s {client.__version__}")
    p.add_argument(
        "--out",
        type=Path,
        default=OUT,
        metavar="DIR",
        help="directory for the outputs (plot, weights), made if missing",
    )


def place_outputs(args: argparse.Namespace, *names: str) -> str | None:
    """Put each output flag among ``names`` (a path, or None) inside ``--out``, unless it is
    absolute, and make ``--out`` if one lands there: before training, not after it. None, or
    why an output cannot be written (one line)."""
    inside = False
    for name in names:
        path = getattr(args, name)
        if path is not None and not path.is_absolute():
            setattr(args, name, args.out / path)
            inside = True
    if inside:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"--out {args.out}: {type(exc).__name__}: {exc}"
    return missing_directory(*(getattr(args, name) for name in names))


def token(args: argparse.Namespace) -> str | None:
    """--token-file's token, else TENSOR_SERVER_TOKEN_FILE's; None: the client reads
    TENSOR_SERVER_TOKEN."""
    path = args.token_file or os.environ.get(TOKEN_FILE_ENV)
    return Path(path).read_text().strip() if path else None


def on_device(args: argparse.Namespace, work: Callable[[Autodiff], T]) -> tuple[T, str]:
    """``work`` run on numpy (--local) or on the server at --url, and where that was, in
    words; raises :class:`Unusable` when the server cannot be reached or refuses us, or the
    URL is not one (``work`` runs while the server is connected: read results inside it)."""
    where = "locally on numpy" if args.local else args.url
    try:
        if args.local:
            print(f"training {where}", flush=True)
            return work(Autodiff(np)), where
        with client.RemoteDevice(args.url, token=token(args)) as dev:
            where = f"on {dev.url}"
            print(f"training on {dev.url} (server {dev.server_id})", flush=True)
            return work(Autodiff(client.namespace(dev))), where
    except (client.TensorwireError, ConnectionError, OSError, ValueError) as exc:
        raise Unusable(f"{where}: {type(exc).__name__}: {exc}") from exc  # ValueError: a URL


def missing_directory(*paths: Path | None) -> str | None:
    """Why an output file cannot be written (checked before training, not after it)."""
    for path in paths:
        if path is not None and not path.absolute().parent.is_dir():
            return f"{path}: no such directory"
    return None


@contextmanager
def progress(
    total: int, done: int = 0, names: tuple[str, ...] = ("loss",)
) -> Iterator[Callable[..., None]]:
    """A rich progress bar of ``total`` steps (``done`` already) showing the moving average
    of each named figure over the last 20 steps; yields ``advance(*figures)``, called once a
    step. A no-op without rich."""
    try:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )
    except ImportError:
        yield lambda *figures: None
        return
    shown = "  ".join(f"{name} {{task.fields[{name}]:.4f}}" for name in names)
    columns = (
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(shown),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=not sys.stderr.isatty(), console=None) as bar:
        unknown: dict[str, Any] = dict.fromkeys(names, float("nan"))
        task = bar.add_task("train", total=total, completed=done, **unknown)
        recent: list[tuple[float, ...]] = []

        def advance(*figures: float) -> None:
            recent.append(figures)
            means: dict[str, Any] = dict(zip(names, np.mean(recent[-20:], axis=0), strict=True))
            bar.update(task, advance=1, **means)

        yield advance


def smooth(values: list[float], window: int = 20) -> np.ndarray:
    """The moving average of ``values`` over the last ``window`` (fewer at the start)."""
    series = np.asarray(values)
    sums = np.cumsum(np.insert(series, 0, 0.0))
    counts = np.minimum(np.arange(1, len(series) + 1), window)
    starts = np.arange(1, len(series) + 1) - counts
    smoothed: np.ndarray = (sums[np.arange(1, len(series) + 1)] - sums[starts]) / counts
    return smoothed


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None, said on stdout, when it is not
    installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[examples]')")
        return None
    return plt
