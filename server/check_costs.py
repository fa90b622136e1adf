"""What checking an op, or registering a graph, costs the event loop: counted before it is done, in
``executor.cost``'s unit (about a nanosecond), so that a check too costly for the loop runs in a
worker thread, as a costly op does (``Session.step``; bench/REASONS.md, 'Checks off the loop').

An op's check (ids looked up, its inference rule, its scratch and cost) walks every tensor id,
dimension, axis and index the op names: its *width*, the lengths of its tuple fields together,
which the header's size alone bounds (a ``stack`` of 2M inputs is a 3.8 MiB header). A
registration checks and plans every op of its graph once, and each declared tensor.
"""

from __future__ import annotations

from protocol.graphs import GraphDef
from protocol.ops.base import BaseOp

CHECK_ITEM = 1 << 11  # a tensor id, dimension, axis or index an op names, checked
REGISTERED_OP = 1 << 14  # an op of a graph being registered: checked, capped and planned


def width(op: BaseOp) -> int:
    """The tensor ids, dimensions, axes and indices ``op`` names: its tuple fields' lengths."""
    items = 0
    for value in op.__dict__.values():
        if type(value) is tuple:
            items += len(value)
    return items


def op_check_cost(op: BaseOp) -> int:
    """What checking ``op`` costs the loop."""
    return CHECK_ITEM * width(op)


def registration_cost(graph: GraphDef, bound: int) -> int:
    """What registering ``graph`` costs the loop, counted until it passes ``bound`` (so that
    counting costs the loop at most ``bound / REGISTERED_OP`` ops)."""
    declared = len(graph.inputs) + len(graph.outputs) + len(graph.constants)
    cost = CHECK_ITEM * declared
    for op in graph.ops:
        if cost > bound:
            break
        cost += REGISTERED_OP + op_check_cost(op)
    return cost


__all__ = ["CHECK_ITEM", "REGISTERED_OP", "op_check_cost", "registration_cost", "width"]
