"""client.nn: modules, layers, losses and weights files, on a real server against numpy
references written here by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors

import client
from client import nn, optim
from client.autodiff import Autodiff, ModifiedInPlaceError, Tensor, no_grad
from client.nn import functional as F


@pytest.fixture
def ad(xp: client.Namespace) -> Autodiff:
    """The autodiff namespace over the remote device."""
    return Autodiff(xp)


def values(x: Any) -> np.ndarray:
    """A tensor's or array's values on the client."""
    array: np.ndarray = np.asarray(x.array if isinstance(x, Tensor) else x)
    return array


def grad_of(t: Tensor) -> np.ndarray:
    assert t.grad is not None
    return values(t.grad)


class Block(nn.Module):
    """A nested model: an own parameter, a layer and a Sequential, in that order."""

    def __init__(self, ad: Autodiff | None = None) -> None:
        super().__init__()
        ad = ad or nn.local_autodiff()
        self.scale = ad.asarray(np.ones(3, np.float32), requires_grad=True)
        self.fc1 = nn.Linear(3, 4, ad=ad)
        self.body = nn.Sequential(nn.Linear(4, 5, ad=ad), nn.ReLU(), nn.Linear(5, 2, ad=ad))
        self.constant = ad.asarray(np.zeros(2, np.float32))  # no grad: not a parameter
        self.note = "not a module"

    def forward(self, x: Any) -> Tensor:
        result: Tensor = self.body(self.fc1(x * self.scale))
        return result


# --- structure ---------------------------------------------------------------------------------


def test_named_parameters_names_and_order() -> None:
    model = Block()
    assert [name for name, _ in model.named_parameters()] == [
        "scale",
        "fc1.weight",
        "fc1.bias",
        "body.0.weight",
        "body.0.bias",
        "body.2.weight",
        "body.2.bias",
    ]
    assert list(model.state_dict()) == [name for name, _ in model.named_parameters()]
    assert sum(values(p).size for p in model.parameters()) == 3 + 16 + 25 + 12
    assert [name for name, _ in model.named_children()] == ["fc1", "body"]
    assert [type(m).__name__ for m in model.modules()] == [
        "Block",
        "Linear",
        "Sequential",
        "Linear",
        "ReLU",
        "Linear",
    ]
    assert [name for name, _ in model.named_parameters(recurse=False)] == ["scale"]


def test_a_shared_parameter_or_module_is_listed_once() -> None:
    model = nn.Module()
    model.a = nn.Linear(2, 2)
    model.b = model.a  # the same layer twice (tied)
    model.tied = model.a.weight
    # each once, under its first name: own parameters come before the submodules'
    assert [name for name, _ in model.named_parameters()] == ["tied", "a.bias"]
    assert len(list(model.children())) == 1
    assert len(list(model.parameters())) == 2


def test_reassignment_keeps_the_place_and_plain_values_unregister() -> None:
    model = nn.Linear(2, 3)
    first = list(model.state_dict())
    model.weight = nn.local_autodiff().asarray(np.zeros((3, 2), np.float32), requires_grad=True)
    assert list(model.state_dict()) == first
    model.bias = None  # PyTorch's bias=False
    assert list(model.state_dict()) == ["weight"]
    del model.weight
    assert list(model.state_dict()) == []


def test_assigning_before_super_init_and_a_missing_forward_are_clear() -> None:
    class Forgetful(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(1, 1)

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Forgetful()
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)


def test_train_eval_and_zero_grad() -> None:
    model = Block()
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    assert model.train() is model and model.body[1].training
    model.namespace.sum(model(np.ones((2, 3), np.float32))).backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_sequential_indexing_and_namespace(ad: Autodiff) -> None:
    model = nn.Sequential(nn.Linear(2, 3, ad=ad), nn.Tanh(), nn.Linear(3, 1, ad=ad))
    assert len(model) == 3 and isinstance(model[1], nn.Tanh) and model[-1] is model[2]
    head = model[:2]
    assert isinstance(head, nn.Sequential) and head[0] is model[0]
    assert [type(m) for m in model] == [nn.Linear, nn.Tanh, nn.Linear]
    assert model.namespace is ad
    with pytest.raises(ValueError, match="no parameters"):
        _ = nn.Sequential(nn.ReLU()).namespace
    with pytest.raises(TypeError, match="argument 1"):
        nn.Sequential(nn.ReLU(), "relu")  # type: ignore[arg-type]
    assert "Linear(in_features=2, out_features=3, bias=True)" in repr(model)


# --- initialisation ----------------------------------------------------------------------------


def test_seeded_initialisation_is_the_same_on_every_device(ad: Autodiff) -> None:
    nn.manual_seed(7)
    remote = nn.Linear(5, 4, ad=ad)
    nn.manual_seed(7)
    local = nn.Linear(5, 4)
    for r, loc in zip(remote.parameters(), local.parameters(), strict=True):
        assert isinstance(r.array, client.RemoteArray) and r.requires_grad
        np.testing.assert_array_equal(values(r), values(loc))
        assert values(r).dtype == np.float32
        assert np.abs(values(r)).max() <= 1 / math.sqrt(5)  # PyTorch's U(-1/sqrt(in), ...)
    again = nn.Linear(5, 4, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(values(again.weight), values(local.weight))
    seeded = nn.manual_seed(1)
    assert nn.default_generator() is seeded
    wide = nn.Linear(2, 3, dtype="float64")
    assert values(wide.weight).dtype == np.float64
    with pytest.raises(ValueError, match="real floating"):
        nn.Linear(2, 3, dtype="int32")


# --- layers against numpy ----------------------------------------------------------------------


def test_linear_forward_and_shape_error(ad: Autodiff) -> None:
    layer = nn.Linear(3, 4, ad=ad)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    w, b = values(layer.weight), values(layer.bias)
    np.testing.assert_allclose(values(layer(x)), x @ w.T + b, rtol=1e-6, atol=1e-6)
    plain = nn.Linear(3, 4, bias=False, ad=ad)
    assert plain.bias is None and len(list(plain.parameters())) == 1
    np.testing.assert_allclose(values(plain(ad.asarray(x))), x @ values(plain.weight).T, 1e-6)
    with pytest.raises(ValueError, match="3 features"):
        layer(np.ones((5, 4), np.float32))


def test_activations_against_their_formulas(ad: Autodiff) -> None:
    x = np.linspace(-4, 4, 17, dtype=np.float32)
    np.testing.assert_array_equal(values(nn.ReLU()(ad.asarray(x))), np.maximum(x, 0))
    np.testing.assert_allclose(values(nn.Tanh()(ad.asarray(x))), np.tanh(x), rtol=1e-6)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(values(nn.GELU()(ad.asarray(x))), gelu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values(F.gelu(ad.asarray(x))), gelu, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="erf"):
        nn.GELU(approximate="none")
    with pytest.raises(ValueError, match="erf"):
        F.gelu(x, approximate="none")


def test_gelu_gradient_is_the_formulas_derivative(ad: Autodiff) -> None:
    x = np.linspace(-3, 3, 13)
    t = ad.asarray(x, requires_grad=True)
    ad.sum(nn.GELU()(t)).backward()
    c = np.sqrt(2 / np.pi)
    inner = c * (x + 0.044715 * x**3)
    expected = 0.5 * (1 + np.tanh(inner)) + 0.5 * x * (1 - np.tanh(inner) ** 2) * c * (
        1 + 3 * 0.044715 * x**2
    )
    np.testing.assert_allclose(grad_of(t), expected, rtol=1e-10)


def test_layer_norm_against_numpy(ad: Autodiff) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32) * 3 + 1
    layer = nn.LayerNorm((4, 5), ad=ad)
    np.testing.assert_array_equal(values(layer.weight), np.ones((4, 5)))
    np.testing.assert_array_equal(values(layer.bias), np.zeros((4, 5)))
    gamma, beta = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    layer.load_state_dict({"weight": gamma, "bias": beta})
    mean = x.mean(axis=(-2, -1), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(-2, -1), keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-5) * gamma + beta
    np.testing.assert_allclose(values(layer(x)), expected, rtol=1e-4, atol=1e-5)
    bare = nn.LayerNorm(5, elementwise_affine=False, eps=1e-3, ad=ad)
    assert list(bare.parameters()) == []
    m1 = x.mean(axis=-1, keepdims=True)
    v1 = x.var(axis=-1, keepdims=True)
    np.testing.assert_allclose(
        values(bare(ad.asarray(x))), (x - m1) / np.sqrt(v1 + 1e-3), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(ValueError, match=r"trailing axes must be \(4, 5\)"):
        layer(np.ones((2, 5, 4), np.float32))


def test_layer_norm_gradient_against_finite_differences(ad: Autodiff) -> None:
    rng = np.random.default_rng(2)
    x, r = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))

    def numpy_loss(x: np.ndarray) -> float:
        centred = x - x.mean(axis=-1, keepdims=True)
        return float(np.sum(centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * r))

    t = ad.asarray(x, requires_grad=True)
    ad.sum(F.layer_norm(t, (6,)) * ad.asarray(r)).backward()
    h, numeric = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        numeric[i] = (numpy_loss(x + e) - numpy_loss(x - e)) / (2 * h)
    np.testing.assert_allclose(grad_of(t), numeric, rtol=1e-5, atol=1e-7)


def test_embedding_repeated_indices_and_their_gradient(ad: Autodiff) -> None:
    table = nn.Embedding(6, 3, ad=ad, rng=np.random.default_rng(3))
    w = values(table.weight)
    assert w.shape == (6, 3) and abs(w.std() - 1) < 0.6  # N(0, 1)
    indices = np.array([[1, 4, 1], [0, 1, 5]])
    out = table(ad.asarray(indices))
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(values(out), w[indices])
    upstream = np.arange(18, dtype=np.float32).reshape(2, 3, 3)
    ad.sum(out * ad.asarray(upstream)).backward()
    expected = np.zeros((6, 3), np.float32)
    np.add.at(expected, indices, upstream)  # a row picked three times gets all three
    np.testing.assert_allclose(grad_of(table.weight), expected, rtol=1e-6)
    assert table(np.array(2)).shape == (3,)
    with pytest.raises(TypeError, match="integers"):
        table(np.ones(2, np.float32))


# --- losses ------------------------------------------------------------------------------------


def test_mse_loss_values_and_gradient(ad: Autodiff) -> None:
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    t = ad.asarray(x, requires_grad=True)
    loss = nn.mse_loss(t, ad.asarray(y))
    np.testing.assert_allclose(float(loss), np.mean((x - y) ** 2), rtol=1e-12)
    loss.backward()
    np.testing.assert_allclose(grad_of(t), 2 * (x - y) / x.size, rtol=1e-12)
    np.testing.assert_allclose(float(nn.mse_loss(t, y, reduction="sum")), np.sum((x - y) ** 2))
    np.testing.assert_allclose(values(nn.mse_loss(t, y, reduction="none")), (x - y) ** 2)
    with pytest.raises(ValueError, match=r"\(4, 3\).*\(4, 1\)"):
        nn.mse_loss(t, np.ones((4, 1)))
    with pytest.raises(ValueError, match="reduction"):
        nn.mse_loss(t, y, reduction="avg")  # type: ignore[arg-type]


def numpy_log_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max(axis=1, keepdims=True)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return result


def test_cross_entropy_values_and_gradient(ad: Autodiff) -> None:
    rng = np.random.default_rng(5)
    z = rng.standard_normal((6, 4)) * 3
    z[0] += 1000.0  # large logits: a naive softmax overflows
    labels = np.array([0, 3, 1, 1, 2, 3])
    t = ad.asarray(z, requires_grad=True)
    loss = nn.cross_entropy(t, ad.asarray(labels))
    per_row = -numpy_log_softmax(z)[np.arange(6), labels]
    np.testing.assert_allclose(float(loss), per_row.mean(), rtol=1e-12)
    loss.backward()
    softmax = np.exp(numpy_log_softmax(z))
    onehot = np.eye(4)[labels]
    np.testing.assert_allclose(grad_of(t), (softmax - onehot) / 6, rtol=1e-10, atol=1e-14)
    none = nn.cross_entropy(t, labels, reduction="none")
    np.testing.assert_allclose(values(none), per_row, rtol=1e-12)
    np.testing.assert_allclose(float(nn.cross_entropy(t, labels, "sum")), per_row.sum(), 1e-12)


def test_cross_entropy_refuses_wrong_shapes_and_dtypes(ad: Autodiff) -> None:
    z = ad.asarray(np.zeros((3, 4), np.float32), requires_grad=True)
    with pytest.raises(ValueError, match=r"one label per row of logits \(3\).*\(2,\)"):
        nn.cross_entropy(z, np.array([0, 1]))
    with pytest.raises(ValueError, match=r"got shape \(3, 1\)"):
        nn.cross_entropy(z, np.zeros((3, 1), np.int64))
    with pytest.raises(ValueError, match=r"logits must be \(N, C\)"):
        nn.cross_entropy(ad.asarray(np.zeros(4, np.float32)), np.array([0]))
    with pytest.raises(TypeError, match="integer class indices"):
        nn.cross_entropy(z, np.zeros(3, np.float32))


# --- state dicts and weights files -------------------------------------------------------------


def mlp(ad: Autodiff | None = None, seed: int = 0) -> nn.Sequential:
    rng = np.random.default_rng(seed)
    return nn.Sequential(
        nn.Linear(3, 5, ad=ad, rng=rng),
        nn.GELU(),
        nn.LayerNorm(5, ad=ad),
        nn.Linear(5, 2, ad=ad, rng=rng),
    )


def same_values(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(np.array_equal(values(sa[k]), values(sb[k])) for k in sa)


def test_a_remote_model_saved_loads_locally_and_back(ad: Autodiff, tmp_path: Path) -> None:
    remote = mlp(ad, seed=1)
    opt = optim.SGD(remote.parameters(), lr=0.1)
    nn.mse_loss(remote(np.ones((4, 3), np.float32)), np.zeros((4, 2), np.float32)).backward()
    opt.step()  # trained on the server: the values exist only there
    path = tmp_path / "model.safetensors"
    remote.save(path)
    with safetensors.safe_open(str(path), framework="np") as f:  # a real safetensors file
        assert sorted(f.keys()) == sorted(remote.state_dict())
        assert f.metadata() == {"format": "tensorwire"}
        assert f.get_tensor("0.weight").dtype == np.float32
    assert nn.load_metadata(path)["format"] == "tensorwire"
    local = mlp(seed=2).load(path)
    assert isinstance(local[0].weight.array, np.ndarray) and same_values(local, remote)
    local.save(tmp_path / "local.safetensors")
    fresh = mlp(ad, seed=3)
    fresh.load_state_dict(nn.load(tmp_path / "local.safetensors"))
    assert isinstance(fresh[0].weight.array, client.RemoteArray) and same_values(fresh, remote)


def test_load_state_dict_keeps_the_tensors_and_copies(ad: Autodiff) -> None:
    model, source = mlp(ad, seed=1), mlp(ad, seed=2)
    tensors = list(model.parameters())
    arrays = [param.array for param in tensors]
    opt = optim.SGD(model.parameters(), lr=1.0)
    model.load_state_dict(source.state_dict())  # arrays of the same device: copied there
    assert list(model.parameters()) == tensors and same_values(model, source)
    assert all(p.array is a for p, a in zip(tensors, arrays, strict=True))  # written in place
    ad.sum(model(np.ones((1, 3), np.float32))).backward()
    opt.step()  # the optimizer built before still updates the model...
    assert not same_values(model, source)  # ...and only it: the values were copied
    local = mlp(seed=4)
    local[0].weight.array.flags.writeable = False  # cannot take the values in place
    local.load_state_dict(mlp(seed=5).state_dict())
    assert same_values(local, mlp(seed=5))
    with no_grad():
        local[0].weight -= 1.0  # writable, and not shared with the other model's arrays


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("2.bias"), r"missing name '2\.bias'.*\(1 missing, 0 unexpected"),
        (lambda s: s.update(extra=np.zeros(1)), r"unexpected name 'extra'"),
        (
            lambda s: s.update({"0.weight": np.zeros((3, 5))}),
            r"'0\.weight'.*shape \(5, 3\).*\(3, 5\)",
        ),
        (
            lambda s: (s.pop("0.bias"), s.update(zzz=np.zeros(1))),
            r"missing name '0\.bias'.*"
            r"\(1 missing, 1 unexpected",
        ),
    ],
)
def test_load_state_dict_names_the_first_mismatch(change: Any, message: str) -> None:
    model = mlp()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    state = {k: v + 1 for k, v in before.items()}
    change(state)
    with pytest.raises(nn.StateDictError, match=message):
        model.load_state_dict(state)
    assert same_values(model, mlp())  # nothing was copied
    assert issubclass(nn.StateDictError, ValueError)


def test_weights_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.safetensors"
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        nn.load(missing)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(nn.WeightsFileError, match="corrupt.safetensors"):
        mlp().load(corrupt)
    with pytest.raises(OSError, match="no_such_dir"):
        nn.save(mlp(), tmp_path / "no_such_dir" / "x.safetensors")


# --- moving between namespaces -----------------------------------------------------------------


def test_to_moves_a_model_there_and_back(ad: Autodiff) -> None:
    local = mlp(seed=6)
    before = {k: v.copy() for k, v in local.state_dict().items()}
    tensors = list(local.parameters())
    local.namespace.sum(local(np.ones((2, 3), np.float32))).backward()
    recorded = local.namespace.sum(local(np.ones((2, 3), np.float32)))
    assert local.to(ad) is local and local.namespace is ad
    with pytest.raises(ModifiedInPlaceError):  # a graph from before the move is refused
        recorded.backward()
    assert list(local.parameters()) == tensors
    assert all(isinstance(p.array, client.RemoteArray) and p.grad is None for p in tensors)
    out = local(np.ones((2, 3), np.float32))  # computes on the server now
    assert isinstance(out.array, client.RemoteArray)
    local.to(nn.local_autodiff())
    assert all(isinstance(p.array, np.ndarray) for p in tensors)
    for name, array in local.state_dict().items():
        np.testing.assert_array_equal(array, before[name])


def test_a_parameter_reassigned_the_result_of_an_op_is_refused() -> None:
    """``self.w = self.w * 2`` would silently unregister w (no optimizer would see it again)."""
    layer = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="result of multiply to parameter .weight."):
        layer.weight = layer.weight * 2.0
    frozen = layer.weight.detach()  # a leaf that does not require grad: a frozen parameter
    layer.weight = frozen
    assert dict(layer.named_parameters())["weight"] is frozen
