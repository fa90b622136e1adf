"""``xp.fft``: the standard's fast Fourier transform extension (the op family ``FFT``)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.ops import FFT

from .._building import apply, upload
from .._handle import checked_device
from ..array import RemoteArray
from ..device import Device


def _fft(
    name: Any,
    x: RemoteArray,
    n: Sequence[int | None] | None,
    axes: Sequence[int] | None,
    norm: Any = "backward",
) -> RemoteArray:
    if norm not in ("backward", "ortho", "forward"):
        raise ValueError(f"norm must be 'backward', 'ortho' or 'forward', not {norm!r}")
    lengths = None if n is None else tuple(None if v is None else operator.index(v) for v in n)
    ax = None if axes is None else tuple(operator.index(a) for a in axes)
    return apply(lambda out: FFT(out=out, op=name, x=x.tensor_id, n=lengths, axes=ax, norm=norm), x)


class FFTNamespace:
    """The ``fft`` extension."""

    def __init__(self, device: Device) -> None:
        self.device = device

    @staticmethod
    def fft(
        x: RemoteArray, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> RemoteArray:
        return _fft("fft", x, None if n is None else (n,), (axis,), norm)

    @staticmethod
    def ifft(
        x: RemoteArray, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> RemoteArray:
        return _fft("ifft", x, None if n is None else (n,), (axis,), norm)

    @staticmethod
    def fftn(
        x: RemoteArray,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> RemoteArray:
        return _fft("fftn", x, s, axes, norm)

    @staticmethod
    def ifftn(
        x: RemoteArray,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> RemoteArray:
        return _fft("ifftn", x, s, axes, norm)

    @staticmethod
    def rfft(
        x: RemoteArray, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> RemoteArray:
        return _fft("rfft", x, None if n is None else (n,), (axis,), norm)

    @staticmethod
    def irfft(
        x: RemoteArray, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> RemoteArray:
        return _fft("irfft", x, None if n is None else (n,), (axis,), norm)

    @staticmethod
    def rfftn(
        x: RemoteArray,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> RemoteArray:
        return _fft("rfftn", x, s, axes, norm)

    @staticmethod
    def irfftn(
        x: RemoteArray,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> RemoteArray:
        return _fft("irfftn", x, s, axes, norm)

    @staticmethod
    def hfft(
        x: RemoteArray, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> RemoteArray:
        return _fft("hfft", x, None if n is None else (n,), (axis,), norm)

    @staticmethod
    def ihfft(
        x: RemoteArray, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> RemoteArray:
        return _fft("ihfft", x, None if n is None else (n,), (axis,), norm)

    @staticmethod
    def fftshift(x: RemoteArray, /, *, axes: int | Sequence[int] | None = None) -> RemoteArray:
        ax = (axes,) if isinstance(axes, int) else axes
        return _fft("fftshift", x, None, ax)

    @staticmethod
    def ifftshift(x: RemoteArray, /, *, axes: int | Sequence[int] | None = None) -> RemoteArray:
        ax = (axes,) if isinstance(axes, int) else axes
        return _fft("ifftshift", x, None, ax)

    def fftfreq(
        self, n: int, /, *, d: float = 1.0, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        """Computed locally (``n`` values) and uploaded."""
        values = np.fft.fftfreq(n, d).astype(dtype or np.float64)
        return upload(values, self.device if device is None else checked_device(device))

    def rfftfreq(
        self, n: int, /, *, d: float = 1.0, dtype: Any = None, device: Device | None = None
    ) -> RemoteArray:
        values = np.fft.rfftfreq(n, d).astype(dtype or np.float64)
        return upload(values, self.device if device is None else checked_device(device))
