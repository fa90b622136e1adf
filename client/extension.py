"""Tensorwire's neural-network extension (``client.autodiff.extension`` says what it is) for
the two kinds of namespace the client knows: a remote one, where each function queues one
protocol op (``protocol/ops/nn.py``; Adam's chains, ``protocol/ops/optim.py``), and numpy,
where each runs the server's own numpy code in this process after the same checks
(``server/executor/``, imported when first used, as ``client.local`` imports the server's
session), so that local results are a server's.

Importing this module registers the numpy extension with ``client.autodiff``; the remote
namespace carries its own as ``__tensorwire_nn__``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from protocol import FEATURE_NN, FEATURE_OPTIM, TensorMeta, from_numpy
from protocol.ops import (
    AdamDirection,
    AnyOp,
    BatchNorm,
    Conv,
    MomentUpdate,
    Pool,
    PoolBackward,
    Random,
    Softmax,
)

from ._building import apply, apply_inplace
from .autodiff import extension
from .device import Device
from .errors import FeatureNotSupportedError

if TYPE_CHECKING:
    from .array import RemoteArray

Pair = tuple[int, int]
Make = Callable[[int, Sequence[int]], AnyOp]  # (output id, input ids) -> the op


class _Ops:
    """The extension's functions, each made into one op and handed to :meth:`_run`."""

    def _run(self, make: Make, *arrays: Any, feature: str = FEATURE_NN) -> Any:
        """``make(an output id, the ids of arrays)``, an op of the protocol ``feature``."""
        raise NotImplementedError

    def _run_in_place(self, make: Make, target: Any, *arrays: Any, feature: str) -> Any:
        """``make(target's id, the ids of arrays)``, an op that writes ``target`` in place."""
        raise NotImplementedError

    def moment_update(
        self, moment: Any, grad: Any, *, decay: float, scale: float, squared: bool
    ) -> Any:
        def make(out: int, ids: Sequence[int]) -> MomentUpdate:
            return MomentUpdate(
                out=out, grad=ids[0], decay=float(decay), scale=float(scale), squared=squared
            )

        return self._run_in_place(make, moment, grad, feature=FEATURE_OPTIM)

    def adam_direction(self, exp_avg: Any, exp_avg_sq: Any, step_size: Any, eps_term: Any) -> Any:
        def make(out: int, ids: Sequence[int]) -> AdamDirection:
            m, v, size, eps = ids
            return AdamDirection(out=out, exp_avg=m, exp_avg_sq=v, step_size=size, eps_term=eps)

        return self._run(make, exp_avg, exp_avg_sq, step_size, eps_term, feature=FEATURE_OPTIM)

    def conv(
        self,
        x: Any,
        weight: Any,
        *,
        stride: Sequence[int],
        padding: Sequence[Pair],
        dilation: Sequence[int],
        groups: int,
    ) -> Any:
        def make(out: int, ids: Sequence[int]) -> Conv:
            return Conv(
                out=out, x=ids[0], w=ids[1], **_spatial(stride, padding, dilation), groups=groups
            )

        return self._run(make, x, weight)

    def conv_transpose(
        self,
        x: Any,
        weight: Any,
        *,
        stride: Sequence[int],
        padding: Sequence[Pair],
        dilation: Sequence[int],
        groups: int,
        output_padding: Sequence[int],
    ) -> Any:
        def make(out: int, ids: Sequence[int]) -> Conv:
            return Conv(
                out=out,
                op="conv_transpose",
                x=ids[0],
                w=ids[1],
                groups=groups,
                **_spatial(stride, padding, dilation),
                output_padding=tuple(int(p) for p in output_padding),
            )

        return self._run(make, x, weight)

    def conv_weight_grad(
        self,
        x: Any,
        grad: Any,
        *,
        kernel: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[Pair],
        dilation: Sequence[int],
        groups: int,
    ) -> Any:
        def make(out: int, ids: Sequence[int]) -> Conv:
            return Conv(
                out=out,
                op="conv_weight_grad",
                x=ids[0],
                w=ids[1],
                groups=groups,
                **_spatial(stride, padding, dilation),
                kernel=tuple(map(int, kernel)),
            )

        return self._run(make, x, grad)

    def pool(
        self,
        op: Literal["max", "avg"],
        x: Any,
        *,
        kernel: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        count_include_pad: bool = True,
    ) -> Any:
        def make(out: int, ids: Sequence[int]) -> Pool:
            return Pool(
                out=out,
                op=op,
                x=ids[0],
                **_window(kernel, stride, padding),
                count_include_pad=count_include_pad,
            )

        return self._run(make, x)

    def pool_backward(
        self,
        op: Literal["max", "avg"],
        x: Any,
        grad: Any,
        *,
        kernel: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        count_include_pad: bool = True,
    ) -> Any:
        def make(out: int, ids: Sequence[int]) -> PoolBackward:
            return PoolBackward(
                out=out,
                op=op,
                x=ids[0],
                grad=ids[1],
                **_window(kernel, stride, padding),
                count_include_pad=count_include_pad,
            )

        return self._run(make, x, grad)

    def batch_norm(
        self, x: Any, mean: Any, var: Any, weight: Any | None, bias: Any | None, *, eps: float
    ) -> Any:
        arrays = [a for a in (x, mean, var, weight, bias) if a is not None]

        def make(out: int, ids: Sequence[int]) -> BatchNorm:
            rest = iter(ids[3:])
            return BatchNorm(
                out=out,
                x=ids[0],
                mean=ids[1],
                var=ids[2],
                eps=float(eps),
                weight=None if weight is None else next(rest),
                bias=None if bias is None else next(rest),
            )

        return self._run(make, *arrays)

    def softmax(self, op: Literal["softmax", "log_softmax"], x: Any, *, axis: int) -> Any:
        return self._run(lambda out, ids: Softmax(out=out, op=op, x=ids[0], axis=int(axis)), x)

    def random(
        self,
        state: Any,
        *,
        op: Literal["uniform", "normal"],
        shape: Sequence[int],
        dtype: Literal["float32", "float64"],
    ) -> Any:
        def make(out: int, ids: Sequence[int]) -> Random:
            return Random(out=out, op=op, state=ids[0], shape=tuple(map(int, shape)), dtype=dtype)

        return self._run(make, state)


def _spatial(
    stride: Sequence[int], padding: Sequence[Pair], dilation: Sequence[int]
) -> dict[str, Any]:
    return {
        "stride": tuple(int(s) for s in stride),
        "padding": tuple((int(lo), int(hi)) for lo, hi in padding),
        "dilation": tuple(int(d) for d in dilation),
    }


def _window(kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> dict[str, Any]:
    return {
        "kernel": tuple(int(k) for k in kernel),
        "stride": tuple(int(s) for s in stride),
        "padding": tuple(int(p) for p in padding),
    }


_FEATURES = {FEATURE_NN: "neural-network ops", FEATURE_OPTIM: "optimizer ops"}


class RemoteExtension(_Ops):
    """The extension on a device: each function queues one op and returns its array at once."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._spoken: set[str] = set()  # the features the server announced (checked once)

    def _speaks(self, feature: str) -> bool:
        conn = getattr(self.device, "_conn", None)  # none: a record-only capture: device
        return conn is None or feature in conn.welcome.features

    def _check(self, feature: str) -> None:
        """Raises FeatureNotSupportedError: the server does not speak ``feature``."""
        if feature not in self._spoken:
            if not self._speaks(feature):
                what = _FEATURES.get(feature, feature)
                raise FeatureNotSupportedError(
                    f"the server at {self.device.url} does not speak Tensorwire's {what} "
                    f"(protocol feature {feature!r}): upgrade it"
                )
            self._spoken.add(feature)

    def _run(self, make: Make, *arrays: Any, feature: str = FEATURE_NN) -> RemoteArray:
        self._check(feature)
        ids = [a.tensor_id for a in arrays]
        return apply(lambda out: make(out, ids), *arrays, device=self.device)

    def _run_in_place(self, make: Make, target: Any, *arrays: Any, feature: str) -> RemoteArray:
        self._check(feature)
        ids = [a.tensor_id for a in arrays]
        return apply_inplace(lambda out: make(out, ids), target, *arrays)

    def has_optimizer_ops(self) -> bool:
        return self._speaks(FEATURE_OPTIM)


class NumpyExtension(_Ops):
    """The extension on numpy arrays: the op checked as a server checks it, then run by the
    server's executor in this process."""

    def _run(self, make: Make, *arrays: Any, feature: str = FEATURE_NN) -> np.ndarray[Any, Any]:
        return self._local(make, arrays, in_place=False)

    def _run_in_place(
        self, make: Make, target: Any, *arrays: Any, feature: str
    ) -> np.ndarray[Any, Any]:
        return self._local(make, (target, *arrays), in_place=True)

    def _local(self, make: Make, arrays: Sequence[Any], in_place: bool) -> np.ndarray[Any, Any]:
        """The op checked as a server checks it, run on ``arrays``; ``in_place``: written into
        the first (where numpy may write it), as a server writes a target of its own."""
        from server import executor  # noqa: PLC0415 - the server loads only when used

        values = [np.asarray(a) for a in arrays]
        op = make(0, range(1, len(values) + 1))
        metas = op.infer_all(*(TensorMeta(v.shape, from_numpy(v.dtype)) for v in values))
        return executor.run(op, values, (), metas, in_place=in_place)[0]

    def has_optimizer_ops(self) -> bool:
        """False: numpy's own in-place calls are cheaper here than building an op for them
        (the functions still run the server's code, for a comparison)."""
        return False


extension.register(np, NumpyExtension())
