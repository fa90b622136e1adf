"""Weights files: a module's parameters in safetensors, the format PyTorch, JAX and Hugging
Face share.

safetensors holds only named, typed, shaped bytes and a small text header, so loading a file
runs no code (a pickle, PyTorch's old ``.pt``, can run anything). The arrays go through numpy
on the client, so a file written from a remote model is an ordinary file: it loads into a local
model, into another server's, or into PyTorch (``Linear`` keeps PyTorch's weight layout).

safetensors is imported when a file is read or written, so ``client.nn`` imports without it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from client.autodiff import Tensor

FORMAT = "tensorwire"  # the header's "format": who wrote the file (PyTorch writes "pt")

PathLike = str | os.PathLike[str]


class WeightsFileError(ValueError):
    """A weights file could not be read as safetensors: corrupt, truncated, or holding a dtype
    numpy lacks (bfloat16). The message names the file."""


class HasStateDict(Protocol):
    """What ``save`` accepts besides a mapping: anything with a ``state_dict()`` (a Module)."""

    def state_dict(self) -> dict[str, Any]: ...


def _safetensors() -> Any:
    """The ``safetensors`` package, or an ImportError that says how to install it."""
    try:
        import safetensors
        import safetensors.numpy
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise ImportError(
            "reading or writing weights files needs safetensors: pip install safetensors"
        ) from exc
    return safetensors


def to_numpy(value: Any) -> np.ndarray[Any, Any]:
    """A tensor's or any array's values as a C-contiguous numpy array (one read for a remote
    array; safetensors writes only contiguous memory)."""
    if isinstance(value, Tensor):
        value = value.array
    array = np.asarray(value)
    # not np.ascontiguousarray alone, which makes a 0-d array 1-d
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def save(
    weights: HasStateDict | Mapping[str, Any],
    path: PathLike,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a module's parameters (or a state dict of arrays of any namespace) to ``path`` as
    a safetensors file; ``metadata`` adds text entries to its header."""
    arrays, header = _prepared(weights, metadata)
    safetensors = _safetensors()
    try:
        safetensors.numpy.save_file(arrays, os.fspath(path), metadata=header)
    except safetensors.SafetensorError as exc:
        raise OSError(f"cannot write the weights file {os.fspath(path)!r}: {exc}") from exc


def to_bytes(
    weights: HasStateDict | Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> bytes:
    """The file :func:`save` would write, as bytes: for a caller that writes it its own way
    (``client.checkpoint``: atomically)."""
    arrays, header = _prepared(weights, metadata)
    data: bytes = _safetensors().numpy.save(arrays, metadata=header)
    return data


def _prepared(
    weights: HasStateDict | Mapping[str, Any], metadata: Mapping[str, str] | None
) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, str]]:
    """The arrays to write, by name, read to numpy, and the header's text entries."""
    state = weights if isinstance(weights, Mapping) else weights.state_dict()
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for name, value in state.items():
        if not isinstance(name, str):
            raise TypeError(f"weights names must be strings, not {name!r}")
        arrays[name] = to_numpy(value)
    return arrays, {"format": FORMAT, **(metadata or {})}


def load(path: PathLike) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays of the safetensors file at ``path``, by name, as numpy arrays (sorted by
    name, as safetensors keeps them); give them to ``Module.load_state_dict`` to put them on
    the module's device.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        WeightsFileError: the file is not a safetensors file numpy can read.
    """
    with _opened(path) as file:
        return {name: file.get_tensor(name) for name in file.keys()}


def load_metadata(path: PathLike) -> dict[str, str]:
    """The text entries of a safetensors file's header (``{"format": "tensorwire"}`` for a
    file this module wrote), without reading its arrays."""
    with _opened(path) as file:
        return dict(file.metadata() or {})


def load_with_metadata(path: PathLike) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, str]]:
    """The arrays of the safetensors file at ``path`` and its header's text entries, read
    from one opening of the file (errors as :func:`load`)."""
    with _opened(path) as file:
        return {name: file.get_tensor(name) for name in file.keys()}, dict(file.metadata() or {})


@contextmanager
def _opened(path: PathLike) -> Iterator[Any]:
    """The safetensors file at ``path``, open for reading with numpy.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        WeightsFileError: the file is not a safetensors file numpy can read.
    """
    where = os.fspath(path)
    if not Path(where).is_file():
        raise FileNotFoundError(f"no weights file at {where!r}")
    safetensors = _safetensors()
    try:
        with safetensors.safe_open(where, framework="np") as file:
            yield file
    except (safetensors.SafetensorError, OSError, KeyError, TypeError, ValueError) as exc:
        raise WeightsFileError(
            f"{where!r} is not a safetensors file numpy can read: {type(exc).__name__}: {exc}"
        ) from exc
