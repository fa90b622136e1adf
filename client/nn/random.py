"""Random numbers drawn on the device, and :func:`manual_seed`.

Each namespace (a server's, the ``ndarray`` device's, numpy's) has one generator, created on
its first draw. Its state is a ``uint64`` array ``[seed, offset]`` on that device: a draw is
one ``random`` op keyed by the state (Philox, ``protocol/ops/nn.py``), so dropout masks and
random tensors never cross the wire, followed by an in-place add of ``[0, 1]`` to the state.
Because the state advances on the device, in place, a step replayed by ``client.capture.jit``
(which binds arrays by identity) draws fresh numbers on every run, the same numbers the step
would draw op by op.

As ``torch.manual_seed``, :func:`manual_seed` seeds everything: the numpy generator that draws
initial parameters on the client (``client.nn.init``) and every device generator, existing
(in place, ``[seed, 0]``) and later ones. One seed therefore gives the same numbers on a
server, on the ``ndarray`` device and on numpy, draw for draw. Without it the seed comes from
fresh entropy, as PyTorch's default; :func:`initial_seed` says which.

These ops are Tensorwire's own extension, not the Array API standard's (which has no random
numbers): a namespace without it (array_api_strict) refuses a draw with a TypeError.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from client.autodiff import Autodiff, Tensor

from . import init

Distribution = Literal["uniform", "normal"]
_SEEDS = 2**64  # a seed is one uint64 word of the Philox key

_seed: int = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
# One generator per wrapped namespace, as long as that namespace lives (a device's namespace
# holds its device; keeping it here would keep a dropped device's session open).
_generators: weakref.WeakKeyDictionary[Any, DeviceGenerator] = weakref.WeakKeyDictionary()


class DeviceGenerator:
    """The random number generator of one namespace: ``state``, a ``uint64`` array ``[seed,
    offset]`` on its device, read by each draw and advanced in place after it."""

    def __init__(self, xp: Any, seed: int) -> None:
        # Weakly: the registry's value must not keep its key, the namespace, alive (its arrays
        # hold the device, not the namespace).
        self._namespace = weakref.ref(xp)
        self.state = xp.asarray(_words(seed, 0))
        self._advance = xp.asarray(_words(0, 1))  # kept: one constant for every draw

    def manual_seed(self, seed: int) -> None:
        """Restart the stream at ``[seed, 0]``, in place, so a replayed step sees it."""
        xp = self._namespace()
        if xp is None:
            raise ReferenceError("manual_seed: this generator's namespace is gone")
        self.state[...] = xp.asarray(_words(_checked(seed), 0))

    def get_state(self) -> np.ndarray[Any, Any]:
        """``[seed, offset]`` as a numpy array (one read from the device)."""
        return np.asarray(self.state).copy()

    def draw(
        self, ad: Autodiff, distribution: Distribution, shape: Sequence[int], dtype: Any
    ) -> Tensor:
        """``shape`` numbers from ``distribution`` (uniform on [0, 1) or standard normal) in
        floating ``dtype``, as a constant tensor of ``ad``; advances the offset by one."""
        sizes = tuple(int(n) for n in shape)
        if any(n < 0 for n in sizes):
            raise ValueError(f"random: sizes must be >= 0, got {sizes}")
        draw = ad.random_uniform if distribution == "uniform" else ad.random_normal
        numbers: Tensor = draw(self.state, sizes, np.dtype(dtype).name)  # a name or a dtype
        self.state += self._advance  # in place: a replayed step advances it too
        return numbers


def _checked(seed: int) -> int:
    """``seed`` as the uint64 it keys: PyTorch's range, [-2**63, 2**64), a negative seed
    taken as its two's complement (``torch.manual_seed(-1).initial_seed() == 2**64 - 1``)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"manual_seed: the seed must be an int, not {type(seed).__name__}")
    if not -(_SEEDS // 2) <= int(seed) < _SEEDS:
        raise ValueError(f"manual_seed: the seed must be in [-2**63, 2**64), not {seed}")
    return int(seed) % _SEEDS


def _words(seed: int, offset: int) -> np.ndarray[Any, Any]:
    return np.array([seed, offset], dtype=np.uint64)


def manual_seed(seed: int) -> np.random.Generator:
    """Seed everything random in ``client.nn``, as ``torch.manual_seed``: the numpy generator
    that draws initial parameters (returned) and every device generator, those that exist (in
    place) and those created later."""
    global _seed
    _seed = _checked(seed)
    for xp, generator in list(_generators.items()):
        try:
            generator.manual_seed(_seed)
        except Exception:  # its device is closed: forget it (a draw there fails anyway)
            _generators.pop(xp, None)
    return init.reseed(_seed)


def initial_seed() -> int:
    """The seed device generators start from: :func:`manual_seed`'s, else fresh entropy
    drawn when ``client.nn`` was imported."""
    return _seed


def device_generator(ad: Autodiff) -> DeviceGenerator:
    """The generator of ``ad``'s namespace, created (from :func:`initial_seed`) on first use."""
    generator = _generators.get(ad.xp)
    if generator is None:
        generator = _generators[ad.xp] = DeviceGenerator(ad.xp, _seed)
    return generator


def _shape(owner: str, size: tuple[Any, ...]) -> tuple[int, ...]:
    """``rand(2, 3)`` and ``rand((2, 3))`` alike, as PyTorch's."""
    if len(size) == 1 and isinstance(size[0], Sequence):
        size = tuple(size[0])
    if not all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in size):
        raise TypeError(f"{owner}: sizes must be ints, got {size}")
    return tuple(int(n) for n in size)


def rand(*size: Any, ad: Autodiff | None = None, dtype: Any = "float32") -> Tensor:
    """Numbers uniform on [0, 1) of shape ``size``, drawn on ``ad``'s device (the local numpy
    one by default) by its generator: ``torch.rand``."""
    ad = init.local_autodiff() if ad is None else ad
    return device_generator(ad).draw(ad, "uniform", _shape("rand", size), dtype)


def randn(*size: Any, ad: Autodiff | None = None, dtype: Any = "float32") -> Tensor:
    """Standard normal numbers of shape ``size``, drawn on ``ad``'s device (the local numpy
    one by default) by its generator: ``torch.randn``."""
    ad = init.local_autodiff() if ad is None else ad
    return device_generator(ad).draw(ad, "normal", _shape("randn", size), dtype)
