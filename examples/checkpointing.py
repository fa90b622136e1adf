"""The training examples' ``--checkpoint DIR``, ``--checkpoint-every N`` and ``--resume``: the
flags, and the numbered checkpoints in DIR (``client.checkpoint``: one file a step, the last
two kept), written every N steps and at the end, the latest loaded on ``--resume``.

What a checkpoint holds beyond the arrays (the data order's random state, the curves so far)
is each example's own ``extra``, so that a resumed run is the uninterrupted one, bit for bit.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client import checkpoint


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        metavar="DIR",
        help="save the whole training state in DIR (client.checkpoint; the last two kept)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=100,
        metavar="N",
        help="with --checkpoint: save every N steps, and at the end",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on from the latest checkpoint in --checkpoint DIR (the same other flags)",
    )


def check_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``p.error`` (exit status 2) for flags that do not go together."""
    if args.resume and args.checkpoint is None:
        p.error("--resume needs --checkpoint DIR")
    if args.checkpoint_every < 1:
        p.error("--checkpoint-every must be at least 1")


def make_directory(args: argparse.Namespace) -> str | None:
    """Make ``--checkpoint DIR`` before training, not after it: None, or why it cannot be."""
    if args.checkpoint is None:
        return None
    try:
        args.checkpoint.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{args.checkpoint}: {type(exc).__name__}: {exc}"
    return None


@dataclass(frozen=True)
class Checkpoints:
    """The checkpoints of one run in ``directory`` (None: none are written), every ``every``
    steps."""

    directory: Path | None
    every: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> Checkpoints:
        return cls(args.checkpoint, args.checkpoint_every)

    def due(self, step: int) -> bool:
        """Whether step ``step`` (counted from 1) ends with a checkpoint."""
        return self.directory is not None and step % self.every == 0

    def latest(self) -> Path | None:
        """The checkpoint to resume from, or None (said on stdout) when there is none yet."""
        assert self.directory is not None  # check_flags: --resume needs --checkpoint
        path = checkpoint.latest(self.directory)
        if path is None:
            print(f"no checkpoint in {self.directory}: starting afresh", flush=True)
        return path

    def resumed(self, info: checkpoint.Checkpoint) -> None:
        print(f"resuming from {info.path} (step {info.step})", flush=True)

    def save(self, step: int, **parts: Any) -> None:
        """``client.checkpoint.save`` of ``parts`` (model, optimizer, scheduler, extra) as step
        ``step``'s checkpoint, the older ones but the last pruned; nothing without a
        directory."""
        if self.directory is None:
            return
        path = checkpoint.save(checkpoint.numbered(self.directory, step), step=step, **parts)
        checkpoint.prune(self.directory, keep=2)
        print(f"checkpoint {path.name} written (step {step})", flush=True)
