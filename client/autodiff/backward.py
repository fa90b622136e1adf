"""Reverse-mode accumulation: from one output, visit the graph in reverse topological order,
sum each tensor's gradient over its uses, and add it to every leaf's ``.grad``.

It knows tensors only by their attributes (``_node``, ``requires_grad``, ``_accumulate``):
tensor.py calls it and is above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tensor import Tensor


def run_backward(root: Tensor, grad: Any, retain_graph: bool) -> None:
    """Accumulate d(root)/d(leaf), weighted by ``grad``, into every leaf that requires grad."""
    grad = _in_dtype_of(root, grad)
    if root._node is None:  # a leaf: its gradient is the output gradient itself
        root._accumulate(grad)
        return
    order = _outputs_before_inputs(root)
    pending: dict[int, Any] = {id(root): grad}
    for tensor in order:
        g = pending.pop(id(tensor), None)
        if g is None:  # nothing reached it (every path here carried no gradient)
            continue
        if tensor._retains_grad:
            tensor._accumulate(g)
        node = tensor._node
        assert node is not None
        for source, g_source in zip(node.inputs, node.input_gradients(tensor, g), strict=True):
            if g_source is None or not source.requires_grad:
                continue
            g_source = _in_dtype_of(source, g_source)
            if source._node is None:
                source._accumulate(g_source)
            elif id(source) in pending:
                pending[id(source)] = pending[id(source)] + g_source
            else:
                pending[id(source)] = g_source
    if not retain_graph:
        for tensor in order:
            assert tensor._node is not None
            tensor._node.free()


def _in_dtype_of(tensor: Tensor, grad: Any) -> Any:
    """``grad`` in ``tensor``'s dtype, as PyTorch keeps every gradient: an op over a float32
    and a float64 input computes in float64, but the float32 input's gradient is float32 (so
    that ``w -= lr * w.grad`` keeps to the standard's in-place dtype rule)."""
    return grad if grad.dtype == tensor.dtype else tensor._ad.xp.astype(grad, tensor.dtype)


def _outputs_before_inputs(root: Tensor) -> list[Tensor]:
    """The non-leaf tensors that ``root`` depends on, each before every tensor it was made
    from (a reversed depth-first post-order; iterative, so deep graphs do not recurse)."""
    order: list[Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        tensor, inputs_done = stack.pop()
        if inputs_done:
            order.append(tensor)
            continue
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        stack.append((tensor, True))
        assert tensor._node is not None
        for source in tensor._node.inputs:
            if source._node is not None and source.requires_grad and id(source) not in seen:
                stack.append((source, False))
    order.reverse()
    return order
