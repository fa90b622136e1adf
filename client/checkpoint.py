"""Checkpoints of a whole training run: the model's parameters, the optimizer's state, the
schedule's position, the step and the caller's own data, in one file that is replaced
atomically, so that a run resumes after a server restart exactly where it was.

::

    from client import checkpoint

    checkpoint.save("run/ckpt.safetensors", model=model, optimizer=opt, scheduler=schedule,
                    step=step, extra={"order": rng.bit_generator.state})
    ...
    info = checkpoint.load("run/ckpt.safetensors", model=model, optimizer=opt,
                           scheduler=schedule)     # a fresh model on a fresh server
    rng.bit_generator.state = info.extra["order"]

The file is one safetensors file (``client.nn.weights``): its arrays are the model's
(``model.NAME``) and the optimizer's state arrays (``optimizer.state.INDEX.KEY``); its header
holds the rest as one JSON text entry (the optimizer's groups and scalar state, the
scheduler's state dict, ``step`` and ``extra``). One file rather than a directory because
one ``os.replace`` swaps it whole: a reader sees the old checkpoint or the new one, never a
mix. It is written to a temporary file beside it, flushed and fsync'ed, renamed over the old
one, and the directory fsync'ed, so a crash at any point leaves the previous checkpoint
intact (and at worst a ``.tmp`` file, which :func:`latest` ignores).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from client.nn import Module, WeightsFileError
from client.nn import weights as weights_file
from client.optim import LRScheduler, Optimizer

VERSION = 1  # the layout of the header's JSON entry
KEY = "tensorwire.checkpoint"  # the header entry that holds it
_NUMBERED = re.compile(r"step-(\d+)\.safetensors")

PathLike = str | os.PathLike[str]


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names the file and what is wrong."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """There is no checkpoint file at the path."""


class CorruptCheckpointError(CheckpointError):
    """The file is not a checkpoint this module can read: truncated, damaged, a weights file
    without the checkpoint entry, or of a later layout."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit what it is loaded into: the model's names or shapes, the
    optimizer's kind or groups, or a part asked for that it does not hold."""


@dataclass(frozen=True)
class Checkpoint:
    """What :func:`load` read besides what it loaded: the ``step`` and ``extra`` given to
    :func:`save`, and the model's arrays as numpy arrays (for parameters kept outside a
    ``Module``)."""

    path: Path
    step: int | None
    extra: Any
    arrays: dict[str, np.ndarray[Any, Any]] = field(repr=False)


def save(
    path: PathLike,
    *,
    model: Module | Mapping[str, Any] | None = None,
    optimizer: Optimizer | None = None,
    scheduler: LRScheduler | None = None,
    step: int | None = None,
    extra: Any = None,
) -> Path:
    """Write a checkpoint to ``path`` atomically (module docstring): the parameters of
    ``model`` (a Module, or a mapping of names to arrays of any namespace), the state dicts
    of ``optimizer`` and ``scheduler``, ``step`` and ``extra`` (JSON-able data of the
    caller's: a data order's random state, say). Arrays on a server are read once each.
    Makes ``path``'s directory if it is missing. Returns the path.

    Raises:
        TypeError: ``extra`` is not JSON-able.
        OSError: the file cannot be written; the previous checkpoint is left as it was.
    """
    target = Path(path)
    arrays: dict[str, Any] = {}
    meta: dict[str, Any] = {"version": VERSION, "step": step, "extra": extra}
    if model is not None:
        state = model.state_dict() if isinstance(model, Module) else model
        arrays.update({f"model.{name}": value for name, value in state.items()})
        meta["model"] = list(state)
    if optimizer is not None:
        saved = optimizer.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for index, entry in saved["state"].items():
            for key, value in entry.items():
                if hasattr(value, "shape"):
                    arrays[f"optimizer.state.{index}.{key}"] = value
                else:
                    scalars.setdefault(str(index), {})[key] = value
        groups = saved["param_groups"]
        meta["optimizer"] = {"kind": type(optimizer).__name__, "param_groups": groups}
        meta["optimizer"]["scalars"] = scalars
    if scheduler is not None:
        meta["scheduler"] = {"kind": type(scheduler).__name__, **scheduler.state_dict()}
    try:
        header = json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a checkpoint's step and extra must be JSON-able: {exc}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, weights_file.to_bytes(arrays, {KEY: header}))
    return target


def load(
    path: PathLike,
    *,
    model: Module | None = None,
    optimizer: Optimizer | None = None,
    scheduler: LRScheduler | None = None,
) -> Checkpoint:
    """Read the checkpoint at ``path`` and load its parts into those given: the model's
    parameters (``Module.load_state_dict``: onto its device), then the optimizer's state
    (where the parameters now live), then the scheduler's. Everything is read and checked
    against the checkpoint's contents before anything is loaded; the model's names and
    shapes are checked by the model.

    Raises:
        CheckpointNotFoundError: there is no file at ``path``.
        CorruptCheckpointError: the file is not a checkpoint this module can read.
        CheckpointMismatchError: a part given does not fit the checkpoint (or it has none).
    """
    where = Path(path)
    try:
        arrays, header = weights_file.load_with_metadata(where)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"no checkpoint at {os.fspath(where)!r}") from exc
    except WeightsFileError as exc:
        raise CorruptCheckpointError(f"{os.fspath(where)!r} is damaged: {exc}") from exc
    meta = _metadata(where, header)
    model_arrays = {
        name[len("model.") :]: value for name, value in arrays.items() if name.startswith("model.")
    }
    opt_state = _optimizer_state(where, meta, arrays, optimizer)
    sched_state = _part(where, meta, "scheduler", scheduler)
    if model is not None:
        if "model" not in meta:
            raise CheckpointMismatchError(f"{os.fspath(where)!r} holds no model")
        _fit(where, "model", lambda: model.load_state_dict(model_arrays))
    if optimizer is not None and opt_state is not None:
        _fit(where, "optimizer", lambda: optimizer.load_state_dict(opt_state))
    if scheduler is not None and sched_state is not None:
        scheduler.load_state_dict(sched_state)
    return Checkpoint(where, meta.get("step"), meta.get("extra"), model_arrays)


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` as the file at ``path``, or the file as it was: written to a temporary file in
    the same directory, flushed and fsync'ed, renamed over ``path`` (``os.replace``: atomic
    on POSIX and Windows), then the directory fsync'ed so the rename survives a power cut.
    The temporary file is removed if anything fails before the rename."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(path.parent)


def _fit(where: PathLike, part: str, load: Callable[[], object]) -> None:
    """Run ``load`` (a ``load_state_dict``); its refusal (a ``StateDictError`` is a
    ``ValueError``) as a :class:`CheckpointMismatchError` naming the file and ``part``."""
    try:
        load()
    except ValueError as exc:
        raise CheckpointMismatchError(
            f"{os.fspath(where)!r} does not fit the {part}: {exc}"
        ) from exc


def numbered(directory: PathLike, step: int) -> Path:
    """The path of step ``step``'s checkpoint in ``directory``: ``step-000123.safetensors``."""
    return Path(directory) / f"step-{step:09d}.safetensors"


def latest(directory: PathLike) -> Path | None:
    """The checkpoint of the highest step in ``directory`` (named by :func:`numbered`), or
    None when there is none (temporary files of an interrupted save are not checkpoints)."""
    found = [
        (int(match.group(1)), entry)
        for entry in Path(directory).glob("step-*.safetensors")
        if (match := _NUMBERED.fullmatch(entry.name))
    ]
    return max(found)[1] if found else None


def prune(directory: PathLike, keep: int) -> None:
    """Remove all but the ``keep`` checkpoints of the highest steps in ``directory``."""
    found = sorted(
        (int(match.group(1)), entry)
        for entry in Path(directory).glob("step-*.safetensors")
        if (match := _NUMBERED.fullmatch(entry.name))
    )
    for _, entry in found[: max(0, len(found) - keep)]:
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()


def _fsync_directory(directory: Path) -> None:
    if os.name == "nt":  # pragma: no cover - Windows cannot open a directory; its rename is durable
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _metadata(where: Path, header: Mapping[str, str]) -> dict[str, Any]:
    text = header.get(KEY)
    if text is None:
        raise CorruptCheckpointError(
            f"{os.fspath(where)!r} is a safetensors file but not a checkpoint (no {KEY!r} "
            "entry): a weights file loads with Module.load"
        )
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointError(f"{os.fspath(where)!r}: its {KEY!r} entry: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("version") != VERSION:
        raise CorruptCheckpointError(
            f"{os.fspath(where)!r} has checkpoint layout {meta.get('version')!r}; this "
            f"client reads layout {VERSION}"
            if isinstance(meta, dict)
            else f"{os.fspath(where)!r}: its {KEY!r} entry is not a JSON object"
        )
    return meta


def _part(where: Path, meta: Mapping[str, Any], name: str, given: Any) -> dict[str, Any] | None:
    """The checkpoint's state of ``name`` for ``given`` (None when not given), checked to be
    of ``given``'s kind."""
    if given is None:
        return None
    saved = meta.get(name)
    if not isinstance(saved, dict):
        raise CheckpointMismatchError(f"{os.fspath(where)!r} holds no {name}")
    kind = saved.get("kind")
    if kind != type(given).__name__:
        raise CheckpointMismatchError(
            f"{os.fspath(where)!r} holds the state of a {kind} {name}, not of a "
            f"{type(given).__name__}"
        )
    return {key: value for key, value in saved.items() if key != "kind"}


def _optimizer_state(
    where: Path, meta: Mapping[str, Any], arrays: Mapping[str, Any], given: Optimizer | None
) -> dict[str, Any] | None:
    """The optimizer's state dict rebuilt from the header and the arrays."""
    saved = _part(where, meta, "optimizer", given)
    if saved is None:
        return None
    state: dict[int, dict[str, Any]] = {
        int(index): dict(scalars) for index, scalars in saved.get("scalars", {}).items()
    }
    for name, value in arrays.items():
        if name.startswith("optimizer.state."):
            index, _, key = name[len("optimizer.state.") :].partition(".")
            state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": saved.get("param_groups", [])}
