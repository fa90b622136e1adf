"""One recorded operation: its name, its inputs and how to send a gradient back through it.

It knows tensors only by their attributes (pyproject.toml's "autodiff in layers").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import GraphFreedError, ModifiedInPlaceError, NoGradientError

if TYPE_CHECKING:
    from .tensor import Tensor

# Given the gradient of the op's output, the gradients of its inputs in the order of
# ``Node.inputs``; None where an input needs none. Arrays of the wrapped namespace throughout.
Backward = Callable[[Any], Sequence[Any]]


class Node:
    """How an output was made: kept by the output tensor until backward() frees it."""

    __slots__ = ("name", "inputs", "backward", "watched", "versions", "output_version", "freed")

    def __init__(
        self,
        name: str,
        inputs: tuple[Tensor, ...],
        backward: Backward | None,
        output_version: int = 0,
        watched: tuple[Tensor, ...] = (),
    ) -> None:
        self.name = name  # the op, named in errors
        self.inputs = inputs
        self.backward = backward  # None: the op has no gradient
        self.watched = inputs + watched  # what the backward may read, and the output below
        self.versions = tuple(t._version for t in self.watched)  # to notice in-place changes
        self.output_version = output_version  # many backwards read the output too
        self.freed = False

    def input_gradients(self, output: Tensor, grad: Any) -> Sequence[Any]:
        """The inputs' gradients from the gradient of ``output`` (the tensor this node made),
        after checking the op may be differentiated now."""
        if self.freed:
            raise GraphFreedError(
                f"backward() through {self.name} a second time: an earlier backward() freed "
                "this graph; pass retain_graph=True to the first call to keep it"
            )
        if self.backward is None:
            raise NoGradientError(
                f"{self.name} has no gradient: its output was differentiated; detach() its "
                "input or compute it inside no_grad() if no gradient should flow through it"
            )
        for tensor, version in zip(self.watched, self.versions, strict=True):
            if tensor._version != version:
                raise ModifiedInPlaceError(
                    f"an input of {self.name} was modified in place after {self.name} used it "
                    f"(version {version}, now {tensor._version}); its gradient would be wrong"
                )
        if output._version != self.output_version:
            raise ModifiedInPlaceError(
                f"the output of {self.name} was modified in place after it was made (version "
                f"{self.output_version}, now {output._version}); its gradient would be wrong"
            )
        return self.backward(grad)

    def free(self) -> None:
        """Drop the inputs and the saved arrays, so the server can release them."""
        self.inputs, self.watched, self.versions, self.backward = (), (), (), None
        self.freed = True
