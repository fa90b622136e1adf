"""``jit``: record a step once, then run it by id, in the manner of tinygrad's ``TinyJit``.

::

    @client.capture.jit
    def train_step(index):
        loss = nn.cross_entropy(model(ad.take(x, index, axis=0)), ad.take(y, index, axis=0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

Off a Tensorwire device (numpy arrays, autodiff tensors over numpy) the function just runs, so
the same training code runs locally. The first call runs the function as it is (it creates
what a first step creates: optimizer state, momentum buffers). From then on, the first call
with a new signature (the shapes, dtypes and devices of the array arguments, the values of
the other arguments, and ``key()`` if given) records the function while it runs
(``client.capture`` with implicit inputs) and registers the graph in the device's session;
later calls with that signature send one ``run_graph`` op and return its outputs, wrapped as
the recorded call's were.

What a replay repeats is the recorded ops, nothing of the Python around them:
- arrays the function reads but is not given (parameters, optimizer state, a resident
  dataset) are bound by identity: updates to them must be in place (``client.optim``'s are),
  and replacing such an array (assigning a new one) is not seen by the graph;
- a Python value computed inside the function is frozen at its recorded value: pass a value
  that changes as an argument, or name it in ``key``, so that a change records a new graph.
  ``client.optim`` keeps what changes from step to step on the device for this reason (Adam's
  bias corrections; the learning rate, which schedulers and ``opt.set_lr`` write between
  steps), so a scheduled learning rate needs neither; Python-side state (``state["step"]``,
  ``.grad`` attributes) does not advance under replay;
- reads inside the function happen when it is recorded only; return what you need instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from protocol import TensorMeta

from ..array import RemoteArray
from ..device import Device
from ..errors import CaptureError
from .graph import RegisteredGraph
from .recorder import Capture

P = ParamSpec("P")
R = TypeVar("R")


def _local(args: Any, kwargs: Any) -> bool:
    """Whether the arguments hold an array of another namespace (numpy's, or an autodiff
    tensor over one): the same training code then runs as it is, with nothing to record."""
    values = [*args, *kwargs.values()]
    return any(hasattr(getattr(v, "array", v), "__array_namespace__") for v in values)


def _raw(leaf: Any) -> RemoteArray | None:
    """The remote array behind ``leaf`` (a RemoteArray, or an autodiff tensor over one)."""
    if isinstance(leaf, RemoteArray):
        return leaf
    inner = getattr(leaf, "array", None)
    return inner if isinstance(inner, RemoteArray) else None


def _flatten(value: Any, leaves: list[Any]) -> Any:
    """A template of ``value`` (tuples, lists, dicts) whose array leaves are their positions."""
    if isinstance(value, tuple | list):
        return type(value)(_flatten(v, leaves) for v in value)
    if isinstance(value, dict):
        return {k: _flatten(v, leaves) for k, v in value.items()}
    if _raw(value) is not None:
        leaves.append(value)
        return _Slot(len(leaves) - 1)
    return value


@dataclass(frozen=True)
class _Slot:
    index: int


def _fill(template: Any, values: list[Any]) -> Any:
    if isinstance(template, _Slot):
        return values[template.index]
    if isinstance(template, tuple | list):
        return type(template)(_fill(v, values) for v in template)
    if isinstance(template, dict):
        return {k: _fill(v, values) for k, v in template.items()}
    return template


def _static(template: Any) -> Hashable:
    """The non-array part of the arguments, as a hashable key: each value with its type (so
    that ``2`` and ``2.0``, or ``1`` and ``True``, record apart).

    Raises:
        CaptureError: an argument that is neither an array of the device nor hashable (a
            numpy array would be uploaded inside the step and frozen into the graph).
    """
    if isinstance(template, tuple | list):
        return (type(template).__name__, tuple(_static(v) for v in template))
    if isinstance(template, dict):
        return ("dict", tuple((k, _static(v)) for k, v in template.items()))
    if isinstance(template, _Slot) or template is None:
        return template
    if not isinstance(template, Hashable) or hasattr(template, "__array__"):
        raise CaptureError(
            f"a jitted function's argument of type {type(template).__name__} can be neither "
            "bound as an input (pass an array of the device) nor keyed as a constant "
            "(pass a hashable value)"
        )
    return (type(template), template)


@dataclass
class _Replay:
    """One recorded signature: the registered graph, the ids bound by identity, and how to
    wrap its outputs as the recorded call returned them."""

    registered: RegisteredGraph
    implicit: list[tuple[int, TensorMeta]]
    template: Any
    wrappers: list[Callable[[RemoteArray], Any]]


class Jitted(Generic[P, R]):
    """A function recorded once per signature and replayed by id (see the module docstring)."""

    def __init__(
        self, fn: Callable[P, R], key: Callable[[], Hashable] | None = None, max_graphs: int = 16
    ) -> None:
        self.fn = fn
        self.key = key
        self.max_graphs = max_graphs
        self.calls = 0
        self.recorded = 0  # graphs recorded, for tests and logs
        self._replays: OrderedDict[Hashable, _Replay] = OrderedDict()

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        self.calls += 1
        if self.calls == 1:  # the warm-up: a first step makes state, which a graph must not
            return self.fn(*args, **kwargs)
        leaves: list[Any] = []
        template = _flatten((args, kwargs), leaves)
        arrays = [_raw(leaf) for leaf in leaves]
        if not leaves and _local(args, kwargs):  # numpy's arrays: no ops to record, run it
            return self.fn(*args, **kwargs)
        first: dict[int, int] = {}  # which arguments are the same array: part of the signature
        signature = (
            _static(template),
            tuple((a.meta, id(a.device)) for a in arrays if a is not None),
            tuple(first.setdefault(a.tensor_id, n) for n, a in enumerate(arrays) if a is not None),
            self.key() if self.key is not None else None,
        )
        replay = self._replays.get(signature)
        if replay is None:
            return self._record(signature, arrays, args, kwargs)
        self._replays.move_to_end(signature)
        return self._replay(replay, arrays)

    def _record(
        self, signature: Hashable, arrays: list[RemoteArray | None], args: Any, kwargs: Any
    ) -> R:
        given = [a for a in arrays if a is not None]
        if not given:
            raise CaptureError(f"{self.fn.__name__}: a jitted function takes at least one array")
        device = given[0].device
        with Capture(device, implicit=True) as cap:
            seen: set[int] = set()
            for index, array in enumerate(given):
                if array.tensor_id not in seen:
                    seen.add(array.tensor_id)
                    cap.input(f"arg{index}", array)
            result = self.fn(*args, **kwargs)
            leaves: list[Any] = []
            template = _flatten(result, leaves)
            if not leaves:
                raise CaptureError(
                    f"{self.fn.__name__} returned no array of the device: a jitted step runs "
                    "as one op, which needs at least one output (return the loss)"
                )
            for index, leaf in enumerate(leaves):
                raw = _raw(leaf)
                assert raw is not None
                cap.output(f"out{index}", raw)
        graph = cap.graph
        explicit = len({a.tensor_id for a in given})
        implicit = [
            (i, t.meta)
            for i, t in zip(cap.input_ids[explicit:], graph.inputs[explicit:], strict=True)
        ]
        self._replays[signature] = _Replay(
            graph.register(device), implicit, template, [_wrapper(leaf) for leaf in leaves]
        )
        self.recorded += 1
        if len(self._replays) > self.max_graphs:
            _, oldest = self._replays.popitem(last=False)
            oldest.registered.drop()
        return result

    def _replay(self, replay: _Replay, arrays: list[RemoteArray | None]) -> R:
        seen: dict[int, RemoteArray] = {}
        for array in arrays:
            if array is not None:
                seen.setdefault(array.tensor_id, array)
        ids = [*seen, *(i for i, _ in replay.implicit)]
        metas = [a.meta for a in seen.values()] + [m for _, m in replay.implicit]
        outputs = replay.registered.run_raw(ids, metas)
        wrapped = [wrap(out) for wrap, out in zip(replay.wrappers, outputs, strict=True)]
        return _fill(replay.template, wrapped)  # type: ignore[no-any-return]

    def reset(self) -> None:
        """Forget every recorded graph (dropped in the session); the next call records."""
        for replay in self._replays.values():
            replay.registered.drop()
        self._replays.clear()


def _wrapper(leaf: Any) -> Callable[[RemoteArray], Any]:
    """How to return a replayed output as the recorded call returned it: the array itself, or
    a tensor of the same autodiff namespace (detached: a replay records no autodiff graph)."""
    if isinstance(leaf, RemoteArray):
        return _identity
    namespace = leaf.namespace
    return lambda array: namespace.tensor(array)


def _identity(array: RemoteArray) -> RemoteArray:
    return array


def jit(
    fn: Callable[P, R] | None = None,
    *,
    key: Callable[[], Hashable] | None = None,
    max_graphs: int = 16,
) -> Any:
    """Decorate a step function: record it once per signature, then replay it by id. As
    ``@jit`` or ``@jit(key=lambda: opt.param_groups[0]["lr"], max_graphs=4)``."""
    if fn is None:
        return lambda f: Jitted(f, key=key, max_graphs=max_graphs)
    return Jitted(fn, key=key, max_graphs=max_graphs)


__all__ = ["Device", "Jitted", "jit"]
