"""``client.namespace(dev)``: an array namespace whose default device is ``dev``.

:class:`Namespace` only assembles: its functions are the categories of the Python Array API
standard (``client.standard``, one mixin per category), and it adds the dtype constants, the
constants, the version, the inspection API and the two extensions. Dtypes are numpy dtype
objects (``xp.float32 == np.dtype("float32")``). This is the client's top layer: it registers
:func:`namespace` with ``client.array`` so that ``x.__array_namespace__()`` finds it.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from ._info import Info
from .array import register_namespace
from .device import Device
from .extension import RemoteExtension
from .standard.creation import CreationFunctions
from .standard.data_types import DataTypeFunctions
from .standard.elementwise import ElementwiseFunctions
from .standard.fft import FFTNamespace
from .standard.indexing import IndexingFunctions
from .standard.linalg import LinalgNamespace
from .standard.linear_algebra import LinearAlgebraFunctions
from .standard.manipulation import ManipulationFunctions
from .standard.searching import SearchingFunctions
from .standard.sets import SetFunctions
from .standard.sorting import SortingFunctions
from .standard.statistical import StatisticalFunctions
from .standard.utility import UtilityFunctions


class Namespace(
    CreationFunctions,
    DataTypeFunctions,
    ElementwiseFunctions,
    IndexingFunctions,
    LinearAlgebraFunctions,
    ManipulationFunctions,
    SearchingFunctions,
    SetFunctions,
    SortingFunctions,
    StatisticalFunctions,
    UtilityFunctions,
):
    """Array functions with ``device`` as the default device for new arrays.

    It passes for a namespace module with the tools that inspect one (array-api-compat's
    ``array_namespace``, scikit-learn, SciPy, the conformance suite): it has the module
    attributes they read, ``__name__`` above all.
    """

    __array_api_version__ = "2024.12"
    __name__ = "client.array_api"  # the module that is this namespace for the default device
    __package__ = "client"

    bool = np.dtype("bool")
    int8 = np.dtype("int8")
    int16 = np.dtype("int16")
    int32 = np.dtype("int32")
    int64 = np.dtype("int64")
    uint8 = np.dtype("uint8")
    uint16 = np.dtype("uint16")
    uint32 = np.dtype("uint32")
    uint64 = np.dtype("uint64")
    float32 = np.dtype("float32")
    float64 = np.dtype("float64")
    complex64 = np.dtype("complex64")
    complex128 = np.dtype("complex128")
    e = math.e
    pi = math.pi
    inf = math.inf
    nan = math.nan
    newaxis = None

    def __init__(self, device: Device) -> None:
        self.device = device
        self.linalg = LinalgNamespace(device)
        self.fft = FFTNamespace(device)
        # Tensorwire's own ops for neural networks, outside the standard (client.nn's front)
        self.__tensorwire_nn__ = RemoteExtension(device)

    def __array_namespace_info__(self) -> Info:
        return Info(self.device)

    def __repr__(self) -> str:
        return f"Namespace({self.device!r})"


# Each device's namespace while one is alive. Weak both ways: the cache keeps neither the
# device (dropping its last reference still closes its session at once) nor the namespace
# (which holds its device).
_namespaces: weakref.WeakKeyDictionary[Device, weakref.ref[Namespace]] = weakref.WeakKeyDictionary()


def namespace(device: Device) -> Namespace:
    """The array namespace whose default device is ``device``: the same object while one is
    alive, so ``x.__array_namespace__() is xp``."""
    ref = _namespaces.get(device)
    space = None if ref is None else ref()
    if space is None:
        space = Namespace(device)
        _namespaces[device] = weakref.ref(space)
    return space


register_namespace(namespace)
