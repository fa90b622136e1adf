"""Tier 1: the indexing shape rule against numpy itself, no server."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol import InvalidOpError
from protocol.ops import UNKNOWN, ArrayIndex, GetItem, SliceSpec, TensorMeta

SHAPES = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


def _wire(item: Any, arrays: list[np.ndarray[Any, Any]]) -> Any:
    if isinstance(item, np.ndarray):
        arrays.append(item)
        return ArrayIndex(tensor=len(arrays))
    if isinstance(item, slice):
        return SliceSpec(start=item.start, stop=item.stop, step=item.step)
    return "..." if item is Ellipsis else item


@settings(max_examples=300, deadline=None)
@given(data=st.data(), shape=SHAPES)
def test_index_shape_matches_numpy(data: st.DataObject, shape: tuple[int, ...]) -> None:
    x = np.zeros(shape)
    key = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True), "key")
    key = key if isinstance(key, tuple) else (key,)
    # replace some integers by integer arrays (advanced indexing)
    items: list[Any] = []
    for k in key:
        if isinstance(k, int) and data.draw(st.booleans()):
            items.append(np.full(data.draw(st.sampled_from([(2,), (1, 3), ()])), k))
        else:
            items.append(k)
    arrays: list[np.ndarray[Any, Any]] = []
    wire = tuple(_wire(k, arrays) for k in items)
    op = GetItem(out=0, x=100, key=wire)
    metas = [TensorMeta(a.shape, "int64") for a in arrays]
    try:
        expected = x[tuple(items)].shape
    except (IndexError, ValueError):
        with pytest.raises(InvalidOpError):
            op.infer(TensorMeta(shape, "float64"), *metas)
        return
    assert op.infer(TensorMeta(shape, "float64"), *metas).shape == expected


def test_boolean_mask_is_one_unknown_dimension() -> None:
    op = GetItem(out=0, x=1, key=(ArrayIndex(tensor=2), SliceSpec(stop=1)))
    meta = op.infer(TensorMeta((3, 4, 5), "float32"), TensorMeta((3, 4), "bool"))
    assert meta.shape == (UNKNOWN, 1)
    with pytest.raises(IndexError):
        op.infer(TensorMeta((3, 4, 5), "float32"), TensorMeta((3, 5), "bool"))
