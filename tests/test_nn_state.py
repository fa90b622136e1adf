"""Module buffers and PyTorch's state_dict names for the convolutional, batch norm and
attention layers: their order, weights files, in-place loading and checkpoints, on a real
server and locally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

import client
from client import checkpoint, nn
from client.autodiff import Autodiff, Tensor
from client.nn import functional as F

from .nn_reference import normal, values


@pytest.fixture
def ad(xp: client.Namespace) -> Autodiff:
    return Autodiff(xp)


class CNN(nn.Module):
    """A small CNN for 8x8 images, its layers named as a PyTorch model's would be."""

    def __init__(self, ad: Autodiff | None = None, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, ad=ad, rng=rng)
        self.bn1 = nn.BatchNorm2d(8, ad=ad)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, ad=ad, rng=rng)
        self.bn2 = nn.BatchNorm2d(16, ad=ad)
        self.flatten = nn.Flatten()
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(16 * 2 * 2, 10, ad=ad, rng=rng)

    def forward(self, x: Any) -> Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        result: Tensor = self.fc(self.drop(self.flatten(F.relu(self.bn2(self.conv2(x))))))
        return result


# What PyTorch's state_dict() of the same model holds, written out from its documentation:
# each module's parameters, then its buffers, module by module in registration order.
CNN_STATE = [
    ("conv1.weight", (8, 1, 3, 3)),
    ("conv1.bias", (8,)),
    ("bn1.weight", (8,)),
    ("bn1.bias", (8,)),
    ("bn1.running_mean", (8,)),
    ("bn1.running_var", (8,)),
    ("bn1.num_batches_tracked", ()),
    ("conv2.weight", (16, 8, 3, 3)),
    ("conv2.bias", (16,)),
    ("bn2.weight", (16,)),
    ("bn2.bias", (16,)),
    ("bn2.running_mean", (16,)),
    ("bn2.running_var", (16,)),
    ("bn2.num_batches_tracked", ()),
    ("fc.weight", (10, 64)),
    ("fc.bias", (10,)),
]


def test_a_cnns_state_dict_has_pytorchs_names_order_and_shapes() -> None:
    model = CNN()
    assert [(name, tuple(v.shape)) for name, v in model.state_dict().items()] == CNN_STATE
    assert [name for name, _ in model.named_parameters()] == [
        name for name, _ in CNN_STATE if "running" not in name and "batches" not in name
    ]
    assert model(normal(2, 1, 8, 8, dtype=np.float32)).shape == (2, 10)
    sequential = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    assert list(sequential.state_dict()) == [
        "0.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
        "3.weight",
        "3.bias",
    ]


def test_a_modules_own_buffers_come_after_its_parameters_and_before_its_children() -> None:
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            ad = nn.local_autodiff()
            self.fc = nn.Linear(2, 2)
            self.register_buffer("seen", ad.asarray(np.zeros(2)))
            self.register_buffer("scratch", ad.asarray(np.zeros(1)), persistent=False)
            self.register_buffer("absent", None)
            self.scale = ad.asarray(np.ones(2), requires_grad=True)

    model = Counting()
    assert list(model.state_dict()) == ["scale", "seen", "fc.weight", "fc.bias"]
    assert [name for name, _ in model.named_buffers()] == ["seen", "scratch"]
    assert [name for name, _ in model.named_parameters()] == ["scale", "fc.weight", "fc.bias"]
    with pytest.raises(TypeError, match="buffer 'seen'.*tensor or None"):
        model.seen = np.zeros(2)
    model.seen = nn.local_autodiff().asarray(np.ones(2))  # replaced, in its place
    assert list(model.state_dict())[1] == "seen" and values(model.state_dict()["seen"])[0] == 1
    ad = nn.local_autodiff()
    with pytest.raises(TypeError, match="requires grad"):
        model.register_buffer("w", ad.asarray(np.ones(1), requires_grad=True))
    with pytest.raises(KeyError, match="no dots"):
        model.register_buffer("a.b", ad.asarray(np.ones(1)))
    with pytest.raises(KeyError, match="already has an attribute 'fc'"):
        model.register_buffer("fc", ad.asarray(np.ones(1)))


def _trained(model: CNN, ad: Autodiff, steps: int = 2) -> None:
    """Forward passes in training mode: the batch norms' running statistics move."""
    for seed in range(steps):
        model(ad.asarray(normal(4, 1, 8, 8, seed=seed, dtype=np.float32) + 1))


def test_buffers_round_trip_through_a_weights_file_into_a_local_model(
    ad: Autodiff, tmp_path: Path
) -> None:
    remote = CNN(ad)
    _trained(remote, ad)
    path = tmp_path / "cnn.safetensors"
    remote.save(path)
    arrays = safetensors.numpy.load_file(str(path))
    assert sorted((k, v.shape) for k, v in arrays.items()) == sorted(CNN_STATE)
    assert arrays["bn1.num_batches_tracked"].dtype == np.int64
    assert arrays["bn1.num_batches_tracked"] == 2
    local = CNN(seed=1).load(path)
    for (name, a), b in zip(remote.state_dict().items(), local.state_dict().values(), strict=True):
        np.testing.assert_array_equal(values(a), values(b), err_msg=name)
    remote.eval(), local.eval()
    x = normal(3, 1, 8, 8, seed=7, dtype=np.float32)
    np.testing.assert_allclose(values(remote(ad.asarray(x))), values(local(x)), rtol=1e-5)


def test_buffers_load_in_place_and_move_with_the_module(ad: Autodiff, tmp_path: Path) -> None:
    source = CNN(seed=3)
    _trained(source, nn.local_autodiff(), steps=3)
    target = CNN(ad, seed=4)
    arrays = {name: b.array for name, b in target.named_buffers()}
    target.load_state_dict(source.state_dict())
    for name, b in target.named_buffers():
        assert b.array is arrays[name]  # written into, on the device
        np.testing.assert_array_equal(values(b), values(dict(source.named_buffers())[name]))
    moved = CNN(seed=5).to(ad)
    assert all(isinstance(b.array, client.RemoteArray) for b in moved.buffers())
    checkpoint.save(tmp_path / "ckpt.safetensors", model=target)
    fresh = CNN(ad, seed=6)
    checkpoint.load(tmp_path / "ckpt.safetensors", model=fresh)
    assert values(fresh.bn2.num_batches_tracked) == 3
    np.testing.assert_array_equal(values(fresh.bn2.running_var), values(source.bn2.running_var))


def test_a_multihead_attention_inside_a_model_keeps_pytorchs_names() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.attn = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)

    assert [(k, tuple(v.shape)) for k, v in Block().state_dict().items()] == [
        ("norm.weight", (8,)),
        ("norm.bias", (8,)),
        ("attn.in_proj_weight", (24, 8)),
        ("attn.in_proj_bias", (24,)),
        ("attn.out_proj.weight", (8, 8)),
        ("attn.out_proj.bias", (8,)),
    ]
