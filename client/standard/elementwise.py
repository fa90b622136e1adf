"""Element-wise functions: one op each, generated from one factory for unary functions and one
for binary functions (the names are the protocol's ``UnaryName`` and ``BinaryName``), and
``clip``."""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from protocol.dtypes import is_complex, is_integer
from protocol.ops import BinaryName, UnaryName

from ..array import RemoteArray, astype, binary, binary_operator, operand, unary

# Every name the factories made, by kind: the test that the tables cover the protocol's ops
# exactly (tests/test_array_api_names.py) reads this.
GENERATED: dict[str, str] = {}


def _unary(name: UnaryName) -> staticmethod[[RemoteArray], RemoteArray]:
    """The standard's unary function ``name(x, /)``."""

    def function(x: RemoteArray, /) -> RemoteArray:
        return unary(name, x)

    GENERATED[name] = "unary"
    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"Element-wise ``{name}`` (one op)."
    return staticmethod(function)


def _binary(name: BinaryName) -> staticmethod[[Any, Any], RemoteArray]:
    """The standard's binary function ``name(x1, x2, /)``; one of them may be a Python scalar."""

    def function(x1: Any, x2: Any, /) -> RemoteArray:
        return binary_function(name, x1, x2)

    GENERATED[name] = "binary"
    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"Element-wise ``{name}`` (one op); one argument may be a Python scalar."
    return staticmethod(function)


def binary_function(name: BinaryName, x1: Any, x2: Any) -> RemoteArray:
    """A namespace binary function: at least one argument must be an array.

    Raises:
        TypeError: neither argument is an array, or one cannot take part in an op.
    """
    if isinstance(x1, RemoteArray):
        result, other = binary_operator(name, x1, x2, reflected=False), x2
    elif isinstance(x2, RemoteArray):
        result, other = binary_operator(name, x2, x1, reflected=True), x1
    else:
        raise TypeError(f"{name} needs at least one array argument")
    if result is NotImplemented:
        raise TypeError(f"{name} does not take {type(other).__name__}")
    return result


class ElementwiseFunctions:
    """Mixed into :class:`~client.namespace.Namespace`. ``matmul`` is a binary op on the wire
    too, but the standard lists it with the linear algebra functions, and so does this
    package."""

    abs = _unary("abs")
    acos = _unary("acos")
    acosh = _unary("acosh")
    asin = _unary("asin")
    asinh = _unary("asinh")
    atan = _unary("atan")
    atanh = _unary("atanh")
    bitwise_invert = _unary("bitwise_invert")
    ceil = _unary("ceil")
    conj = _unary("conj")
    cos = _unary("cos")
    cosh = _unary("cosh")
    exp = _unary("exp")
    expm1 = _unary("expm1")
    floor = _unary("floor")
    imag = _unary("imag")
    isfinite = _unary("isfinite")
    isinf = _unary("isinf")
    isnan = _unary("isnan")
    log = _unary("log")
    log1p = _unary("log1p")
    log2 = _unary("log2")
    log10 = _unary("log10")
    logical_not = _unary("logical_not")
    negative = _unary("negative")
    positive = _unary("positive")
    real = _unary("real")
    reciprocal = _unary("reciprocal")
    round = _unary("round")
    sign = _unary("sign")
    signbit = _unary("signbit")
    sin = _unary("sin")
    sinh = _unary("sinh")
    sqrt = _unary("sqrt")
    square = _unary("square")
    tan = _unary("tan")
    tanh = _unary("tanh")
    trunc = _unary("trunc")

    add = _binary("add")
    atan2 = _binary("atan2")
    bitwise_and = _binary("bitwise_and")
    bitwise_left_shift = _binary("bitwise_left_shift")
    bitwise_or = _binary("bitwise_or")
    bitwise_right_shift = _binary("bitwise_right_shift")
    bitwise_xor = _binary("bitwise_xor")
    copysign = _binary("copysign")
    divide = _binary("divide")
    equal = _binary("equal")
    floor_divide = _binary("floor_divide")
    greater = _binary("greater")
    greater_equal = _binary("greater_equal")
    hypot = _binary("hypot")
    less = _binary("less")
    less_equal = _binary("less_equal")
    logaddexp = _binary("logaddexp")
    logical_and = _binary("logical_and")
    logical_or = _binary("logical_or")
    logical_xor = _binary("logical_xor")
    maximum = _binary("maximum")
    minimum = _binary("minimum")
    multiply = _binary("multiply")
    nextafter = _binary("nextafter")
    not_equal = _binary("not_equal")
    pow = _binary("pow")
    remainder = _binary("remainder")
    subtract = _binary("subtract")

    @staticmethod
    def clip(x: RemoteArray, /, min: Any = None, max: Any = None) -> RemoteArray:  # noqa: A002
        """Note: the result keeps ``x``'s dtype, as the standard asks (numpy promotes)."""
        if is_complex(x.wire_dtype):
            raise TypeError("clip does not order complex numbers")
        result = x
        names: tuple[BinaryName, BinaryName] = ("maximum", "minimum")
        for bound, name in zip((min, max), names, strict=True):
            if bound is None:
                continue
            if not isinstance(bound, RemoteArray) and is_integer(x.wire_dtype):
                if isinstance(bound, float):
                    raise TypeError("a float bound cannot clip an integer array")
                info = np.iinfo(x.dtype)
                bound = builtins.min(builtins.max(int(bound), int(info.min)), int(info.max))
            other = operand(bound, x)
            if other is None:
                raise TypeError(f"clip does not take {type(bound).__name__}")
            if other.wire_dtype != x.wire_dtype:
                other = astype(other, x.dtype)
            result = binary(name, result, other)  # a NaN bound propagates
        return result if result is not x else astype(x, x.dtype)
