"""A Python scalar operand travels inside its op (``binary_scalar``, ``binary_inplace_scalar``),
through a real server: one op where there were two (a ``full``, then the binary op), with
exactly the results and errors of those two ops, which the old path is kept here to compare
against (``binary`` of a ``full``)."""

from __future__ import annotations

import itertools
from typing import Any, get_args

import numpy as np
import pytest

import client
from client.array import binary, full
from protocol import TensorMeta
from protocol.ops import BinaryName, BinaryScalar, InPlaceBinaryScalar
from protocol.scalars import PyScalar, scalar_dtype

NAMES = [name for name in get_args(BinaryName) if name != "matmul"]
DTYPES = ["bool", "int8", "uint8", "int64", "float32", "float64", "complex64"]
SCALARS: list[PyScalar] = [True, 3, -2, 0.5, float("-inf"), 1.5 - 2j, 300]


def _values(dtype: str) -> np.ndarray[Any, Any]:
    base = np.array([0, 1, 2, 5, 7, 100], dtype=np.int64)
    if dtype == "bool":
        return base % 2 == 1
    if dtype.startswith(("float", "complex")):
        return (base - 3.25).astype(dtype)
    return (base - 3 if dtype.startswith("int") else base).astype(dtype)


def _outcome(make: Any) -> tuple[str, Any]:
    """``make()``'s values (with their dtype), or the type and message of what it raised, at
    once or on reading."""
    try:
        values = make().numpy()
    except Exception as exc:  # the comparison is of which error, not of whether there was one
        return (type(exc).__name__, str(exc).split(" -> ")[0].split("(")[0])
    return (values.dtype.str, values.tobytes())


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_binary_op_with_a_scalar_gives_what_the_two_op_path_gave(
    dev: client.RemoteDevice, xp: client.Namespace, dtype: str
) -> None:
    x = xp.asarray(_values(dtype))
    compared, succeeded = 0, 0
    for name, value, first in itertools.product(NAMES, SCALARS, (False, True)):
        op_name = "__r" + name if first else name

        def one_op(name: BinaryName = name, value: PyScalar = value, first: bool = first) -> Any:
            return getattr(xp, name)(value, x) if first else getattr(xp, name)(x, value)

        def two_ops(name: BinaryName = name, value: PyScalar = value, first: bool = first) -> Any:
            s = full((), value, scalar_dtype(value, x.wire_dtype), dev)
            return binary(name, s, x) if first else binary(name, x, s)

        new, old = _outcome(one_op), _outcome(two_ops)
        assert new == old, (op_name, dtype, value)
        compared += 1
        succeeded += isinstance(new[1], bytes)
    assert compared == len(NAMES) * len(SCALARS) * 2 and succeeded > compared // 3


def test_operators_send_one_op_per_scalar(
    dev: client.RemoteDevice, xp: client.Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    submit = dev.submit
    monkeypatch.setattr(dev, "submit", lambda op: sent.append(op.kind) or submit(op))
    x = xp.asarray(np.arange(4.0))
    sent.clear()
    y = 2.0 * (x + 1) - 0.5
    y = 1 - y / 4 + x**2
    z = xp.where(x > 1, y, 0.0)  # where's scalar is still a full (one op per scalar there)
    assert sent == ["binary_scalar"] * 5 + ["binary_scalar", "binary"] + [
        "binary_scalar",
        "full",
        "where",
    ]
    x *= 0.5
    assert sent[-1] == "binary_inplace_scalar"
    a = np.arange(4.0)
    want = np.where(a > 1, 1 - (2.0 * (a + 1) - 0.5) / 4 + a**2, 0.0)
    assert np.array_equal(z.numpy(), want) and np.array_equal(x.numpy(), a * 0.5)


def test_scalar_operands_follow_the_standards_promotion(xp: client.Namespace) -> None:
    i8 = xp.asarray(np.arange(4, dtype=np.int8))
    f32 = xp.asarray(np.arange(4, dtype=np.float32))
    assert (i8 + 1).dtype == np.int8 and (i8 * 0.5).dtype == np.float64
    assert (f32 + 1).dtype == np.float32 and (f32 * 2.0).dtype == np.float32
    assert (f32 + 1j).dtype == np.complex64 and (i8 > 1).dtype == np.bool_
    assert (True & xp.asarray(np.array([True, False]))).dtype == np.bool_
    with pytest.raises(OverflowError, match="out of bounds for int8"):
        i8 + 1000  # numpy 2 refuses it too; raised here, before anything is sent
    with pytest.raises(ValueError, match="0-dimensional"):
        f32 @ 2.0


def test_in_place_scalar_ops_write_the_target_and_its_views(xp: client.Namespace) -> None:
    base = np.arange(12.0).reshape(3, 4)
    x = xp.asarray(base)
    row = x[1]
    tensor_id = x.tensor_id
    x *= 0.5
    x -= 1
    x **= 2
    assert x.tensor_id == tensor_id
    want = (base * 0.5 - 1) ** 2
    assert np.array_equal(x.numpy(), want) and np.array_equal(row.numpy(), want[1])
    i = xp.asarray(np.arange(4, dtype=np.int32))
    with pytest.raises(TypeError, match="cannot store float64 into int32"):
        i /= 2
    with pytest.raises(OverflowError):
        i += 2**40
    i //= 2
    assert np.array_equal(i.numpy(), np.arange(4, dtype=np.int32) // 2)


def test_a_scalar_op_refused_by_the_server_costs_nothing_else(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    """Sent without the local checks: a bignum, an integer out of range, a matmul, an unknown
    input. Each read raises the typed error; the connection, the other tensors and the
    accounting stay."""
    x = xp.asarray(np.arange(4, dtype=np.int64))
    dev.sync()
    before = dev.stats()
    meta = TensorMeta((4,), "int64")
    bad = [
        BinaryScalar(op="add", out=dev.new_id(), x=x.tensor_id, scalar=2**200),
        BinaryScalar(op="add", out=dev.new_id(), x=x.tensor_id, scalar=-(2**63) - 1),
        BinaryScalar(op="matmul", out=dev.new_id(), x=x.tensor_id, scalar=1.0),
        BinaryScalar(op="add", out=dev.new_id(), x=123456789, scalar=1.0),
    ]
    handles = [dev.submit_unchecked(op, meta) for op in bad]
    for handle, code in zip(handles, ["invalid_op"] * 3 + ["unknown_tensor"], strict=True):
        with pytest.raises(client.RemoteError) as info:
            handle.numpy()
        assert info.value.code == code
    target = xp.asarray(np.arange(4, dtype=np.int64))
    dev.submit(InPlaceBinaryScalar(op="add", out=target.tensor_id, scalar=2**64))
    with pytest.raises(client.RemoteError) as info:
        target.numpy()  # a refused in-place op fails its target, as a refused x += y does
    assert info.value.code == "invalid_op"
    assert np.array_equal(x.numpy(), np.arange(4))
    assert np.array_equal((x + 1).numpy(), np.arange(1, 5))
    del target
    del handles
    dev.sync()
    after = dev.stats()
    assert (after.tensor_bytes, after.server_tensor_bytes) == (
        before.tensor_bytes,
        before.server_tensor_bytes,
    )


def test_a_long_chain_of_scalar_ops_matches_numpy(
    dev: client.RemoteDevice, xp: client.Namespace
) -> None:
    x = xp.asarray(np.linspace(-1, 1, 16, dtype=np.float32))
    local = np.linspace(-1, 1, 16, dtype=np.float32)
    for step in range(2000):
        x = x * 0.99 + 0.01 if step % 2 else 0.5 - x
        local = local * 0.99 + 0.01 if step % 2 else 0.5 - local
    assert x.dtype == np.float32
    assert np.array_equal(x.numpy(), local)


def test_numpy_scalars_keep_their_own_dtype(
    dev: client.RemoteDevice, xp: client.Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numpy's float64 and complex128 subclass float and complex, but are not Python scalars:
    they take part with their own dtype (numpy 2 and the standard treat them as 0-d arrays),
    as an uploaded 0-d array, not inside the op."""
    local = np.array([1.0, 3.0, 0.7], dtype=np.float32)
    x = xp.asarray(local)
    sent: list[str] = []
    submit = dev.submit
    monkeypatch.setattr(dev, "submit", lambda op: sent.append(op.kind) or submit(op))
    for value in (np.float64(0.1), np.complex128(1 - 2j), np.float32(0.25), np.int64(3)):
        for got, want in (
            (x + value, local + value),
            (value * x, value * local),
            (xp.add(x, value), np.add(local, value)),
        ):
            assert got.dtype == want.dtype, (value, got.dtype, want.dtype)
            assert np.array_equal(got.numpy(), want)
    assert "binary_scalar" not in sent
    y, y_local = (
        xp.asarray(np.linspace(0, 1, 1000, dtype=np.float32)),
        np.linspace(0, 1, 1000, dtype=np.float32),
    )
    y *= np.float64(1 / 3)
    y_local *= np.float64(1 / 3)
    assert np.array_equal(y.numpy(), y_local)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cached_inference_for_float_and_bool_scalars_is_the_full_rule(dtype: str) -> None:
    """``BinaryScalar.infer`` caches what float and bool scalars give (their value plays no
    part): it gives what the binary rule gives for the scalar's 0-d meta, or raises its error,
    on every op (matmul too) and side, repeated so that the cached answer is the one checked."""
    from protocol.ops.elementwise import binary_meta, operand_dtype

    x = TensorMeta((3, 2), dtype)  # type: ignore[arg-type]
    values = [True, False, 0.5, float("nan"), 1e300]
    for name, value, first, _ in itertools.product(
        get_args(BinaryName), values, [False, True], "ab"
    ):
        op = BinaryScalar(op=name, out=1, x=0, scalar=value, scalar_first=first)
        try:
            s = TensorMeta((), operand_dtype(value, dtype))  # type: ignore[arg-type]
            want: TensorMeta | type[Exception] = (
                binary_meta(name, s, x) if first else binary_meta(name, x, s)
            )
        except Exception as exc:  # noqa: BLE001 - the same error type is expected
            want = type(exc)
        if isinstance(want, TensorMeta):
            assert op.infer(x) == want, (name, value, first)
        else:
            with pytest.raises(want):
                op.infer(x)
