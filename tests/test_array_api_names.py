"""The namespace has every name of the Array API standard 2024.12 (the spec's lists)."""

from __future__ import annotations

import inspect
import sys
from typing import get_args

import numpy as np
import pytest

import client
from client.standard.elementwise import GENERATED
from protocol.ops import BinaryName, UnaryName

MAIN = """
e inf nan newaxis pi
arange asarray empty empty_like eye from_dlpack full full_like linspace meshgrid ones ones_like
tril triu zeros zeros_like
astype can_cast finfo iinfo isdtype result_type
abs acos acosh add asin asinh atan atan2 atanh bitwise_and bitwise_left_shift bitwise_invert
bitwise_or bitwise_right_shift bitwise_xor ceil clip conj copysign cos cosh divide equal exp
expm1 floor floor_divide greater greater_equal hypot imag isfinite isinf isnan less less_equal
log log1p log2 log10 logaddexp logical_and logical_not logical_or logical_xor maximum minimum
multiply negative nextafter not_equal positive pow real reciprocal remainder round sign signbit
sin sinh square sqrt subtract tan tanh trunc
take take_along_axis
matmul matrix_transpose tensordot vecdot
broadcast_arrays broadcast_to concat expand_dims flip moveaxis permute_dims repeat reshape roll
squeeze stack tile unstack
argmax argmin count_nonzero nonzero searchsorted where
unique_all unique_counts unique_inverse unique_values
argsort sort
cumulative_sum cumulative_prod max mean min prod std sum var
all any diff
bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float32 float64 complex64 complex128
__array_namespace_info__
""".split()
LINALG = """
cholesky cross det diagonal eigh eigvalsh inv matmul matrix_norm matrix_power matrix_rank
matrix_transpose outer pinv qr slogdet solve svd svdvals tensordot trace vecdot vector_norm
""".split()
FFT = """
fft ifft fftn ifftn rfft irfft rfftn irfftn hfft ihfft fftfreq rfftfreq fftshift ifftshift
""".split()
ARRAY = """__abs__ __add__ __and__ __array_namespace__ __bool__ __complex__ __dlpack__
__dlpack_device__ __eq__ __float__ __floordiv__ __ge__ __getitem__ __gt__ __index__ __int__
__invert__ __le__ __lshift__ __lt__ __matmul__ __mod__ __mul__ __ne__ __neg__ __or__ __pos__
__pow__ __rshift__ __setitem__ __sub__ __truediv__ __xor__ to_device __iadd__ __isub__ __imul__
__itruediv__ __ifloordiv__ __imod__ __ipow__ __iand__ __ior__ __ixor__ __ilshift__ __irshift__
__radd__ __rsub__ __rmul__ __rtruediv__ __rfloordiv__ __rmod__ __rpow__ __rand__ __ror__
__rxor__ __rlshift__ __rrshift__ __rmatmul__""".split()
ATTRIBUTES = "dtype device mT ndim shape size T".split()


@pytest.mark.parametrize(("where", "names"), [("main", MAIN), ("linalg", LINALG), ("fft", FFT)])
def test_every_function_of_the_standard_exists(
    xp: client.Namespace, where: str, names: list[str]
) -> None:
    space = xp if where == "main" else getattr(xp, where)
    missing = [n for n in names if not hasattr(space, n)]
    assert not missing
    assert xp.__array_api_version__ == "2024.12"


def test_every_array_method_and_attribute_exists(xp: client.Namespace) -> None:
    x = xp.asarray(np.ones((2, 2)))
    assert not [n for n in ARRAY if not callable(getattr(x, n, None))]
    assert not [n for n in ATTRIBUTES if not hasattr(x, n)]


def test_elementwise_functions_are_generated_for_exactly_the_protocols_ops() -> None:
    """One generated function per unary and binary op of the protocol, none more, each on the
    namespace as the standard writes it: ``name(x, /)``, ``name(x1, x2, /)``."""
    unary = {name for name, kind in GENERATED.items() if kind == "unary"}
    binary = {name for name, kind in GENERATED.items() if kind == "binary"}
    assert unary == set(get_args(UnaryName))
    assert binary == set(get_args(BinaryName))
    positional = inspect.Parameter.POSITIONAL_ONLY
    for names, params in ((unary, ["x"]), (binary, ["x1", "x2"])):
        for name in names:
            attribute = inspect.getattr_static(client.Namespace, name)
            assert isinstance(attribute, staticmethod), name
            assert attribute.__func__.__module__ == "client.standard.elementwise", name
            signature = inspect.signature(getattr(client.Namespace, name))
            assert [(p.name, p.kind) for p in signature.parameters.values()] == [
                (p, positional) for p in params
            ], name


def test_the_namespace_passes_for_a_namespace_module(
    dev: client.RemoteDevice, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tools that inspect a namespace (array-api-compat, scikit-learn, SciPy, the conformance
    suite) read its ``__name__``; ``client.array_api`` is the very same object."""
    x = client.namespace(dev).asarray(np.ones(2))
    xp = x.__array_namespace__()
    assert xp is client.namespace(dev) is x.__array_namespace__(api_version="2024.12")
    assert xp.__name__ == "client.array_api" and isinstance(xp.__name__, str)
    monkeypatch.setenv("TENSORWIRE_URL", url)
    monkeypatch.delitem(sys.modules, "client.array_api", raising=False)
    try:
        import client.array_api as module

        assert isinstance(module, client.Namespace)
        y = module.asarray(np.ones(2))
        assert y.__array_namespace__() is module is sys.modules["client.array_api"]
        assert client.namespace(y.device) is module
    finally:  # the next import connects afresh
        sys.modules.pop("client.array_api", None)
        vars(client).pop("array_api", None)
