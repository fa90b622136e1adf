"""Checkpoints of the whole training state (client.checkpoint, the optimizers' and schedulers'
state dicts) through real servers: a run resumed from a checkpoint on a fresh server, after
the first was killed with SIGKILL, ends with the parameters of a run never interrupted, bit
for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import client
from client import checkpoint, nn, optim
from client.autodiff import Autodiff
from client.capture import jit

from .classifying import classifier_step
from .servers import ROOT, ServerProcess, run_server

KINDS = ["sgd-momentum-steplr", "adam-cosine", "adamw-cosine"]


class Run:
    """A small classifier on the device, an optimizer, a schedule and a data order; the same
    seeds in every instance but ``init`` (a resumed run must take its weights from the
    checkpoint)."""

    def __init__(self, ad: Autodiff, kind: str, init: int = 2) -> None:
        rng = np.random.default_rng(11)
        self.ad = ad
        self.x = ad.asarray(rng.standard_normal((48, 10)).astype(np.float32))
        self.y = ad.asarray(rng.integers(0, 4, 48))
        weights = np.random.default_rng(init)
        self.net = nn.Sequential(
            nn.Linear(10, 20, ad=ad, rng=weights), nn.Tanh(), nn.Linear(20, 4, ad=ad, rng=weights)
        )
        params = list(self.net.parameters())
        self.opt: optim.Optimizer
        self.schedule: optim.LRScheduler
        if kind == "sgd-momentum-steplr":
            self.opt = optim.SGD(params, lr=0.2, momentum=0.9, weight_decay=1e-3)
            self.schedule = optim.StepLR(self.opt, step_size=3, gamma=0.5)
        else:
            make = optim.Adam if kind == "adam-cosine" else optim.AdamW
            self.opt = make([{"params": params[:2]}, {"params": params[2:], "lr": 5e-3}], lr=2e-2)
            self.schedule = optim.CosineAnnealingLR(self.opt, T_max=8, eta_min=1e-3)
        self.order = np.random.default_rng(6)
        self.done = 0

    def step(self, index: Any) -> Any:
        return classifier_step(self.ad, self.net, self.opt, self.x, self.y, index)

    def train(self, steps: int, step: Any = None) -> None:
        for _ in range(steps):
            (step or self.step)(self.ad.asarray(self.order.integers(0, 48, 16)))
            self.schedule.step()
            self.done += 1

    def save(self, path: Path) -> None:
        checkpoint.save(
            path,
            model=self.net,
            optimizer=self.opt,
            scheduler=self.schedule,
            step=self.done,
            extra={"order": self.order.bit_generator.state},
        )

    def load(self, path: Path) -> checkpoint.Checkpoint:
        info = checkpoint.load(path, model=self.net, optimizer=self.opt, scheduler=self.schedule)
        self.order.bit_generator.state = info.extra["order"]
        self.done = int(info.step or 0)
        return info

    def weights(self) -> list[np.ndarray]:
        return [np.asarray(p.array) for p in self.net.parameters()]


def _assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for left, right in zip(a, b, strict=True):
        assert left.dtype == right.dtype and np.array_equal(left, right)


# --- (a) state dicts: PyTorch's layout, round trips ---------------------------------------------
TORCH_GROUP_KEYS = {
    "SGD": {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach"}
    | {"differentiable", "fused", "initial_lr", "params"},
    "Adam": {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable"}
    | {"differentiable", "fused", "decoupled_weight_decay", "initial_lr", "params"},
}


@pytest.mark.parametrize("kind", KINDS)
def test_state_dicts_have_pytorchs_layout(xp: client.Namespace, kind: str) -> None:
    run = Run(Autodiff(xp), kind)
    assert run.opt.state_dict()["state"] == {}  # no state before a step, as PyTorch's
    run.train(3)
    saved = run.opt.state_dict()
    groups = saved["param_groups"]
    family = "SGD" if kind.startswith("sgd") else "Adam"
    assert all(set(group) == TORCH_GROUP_KEYS[family] for group in groups)
    assert [group["params"] for group in groups] in ([[0, 1, 2, 3]], [[0, 1], [2, 3]])
    assert sorted(saved["state"]) == [0, 1, 2, 3]
    params = list(run.net.parameters())
    for index, entry in saved["state"].items():
        if family == "SGD":
            assert set(entry) == {"momentum_buffer"}
        else:
            assert set(entry) >= {"step", "exp_avg", "exp_avg_sq"} and entry["step"] == 3
            assert entry["exp_avg"].shape == params[index].shape
            assert entry["beta1_power"].shape == ()  # the device's beta1**t
        for value in entry.values():
            if hasattr(value, "shape"):
                assert isinstance(value, client.RemoteArray)  # on the device: nothing read
    schedule = run.schedule.state_dict()
    assert {"base_lrs", "last_epoch", "_last_lr", "_step_count"} <= set(schedule)
    assert schedule["last_epoch"] == 3 and schedule["_step_count"] == 4
    assert ("T_max" in schedule) == (family == "Adam")


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_dict_loaded_into_a_twin_goes_on_as_the_original(
    xp: client.Namespace, kind: str
) -> None:
    ad = Autodiff(xp)
    original, twin = Run(ad, kind), Run(ad, kind, init=9)
    original.train(4)
    twin.net.load_state_dict(original.net.state_dict())
    twin.opt.load_state_dict(original.opt.state_dict())
    twin.schedule.load_state_dict(original.schedule.state_dict())
    twin.order.bit_generator.state = original.order.bit_generator.state
    for entry, theirs in zip(
        twin.opt.state.values(), original.opt.state.values(), strict=True
    ):  # copies, not the original's arrays: each goes on updating its own
        for key, value in entry.items():
            if hasattr(value, "shape"):
                assert value is not theirs[key]
    original.train(5)
    twin.train(5)
    _assert_same(twin.weights(), original.weights())


def test_loading_refuses_what_does_not_fit(xp: client.Namespace) -> None:
    ad = Autodiff(xp)
    run = Run(ad, "adamw-cosine")
    run.train(2)
    saved = run.opt.state_dict()
    with pytest.raises(ValueError, match="2 parameter groups"):
        optim.AdamW(run.net.parameters()).load_state_dict(saved)
    bad = {**saved, "param_groups": [{**g, "amsgrad": True} for g in saved["param_groups"]]}
    with pytest.raises(ValueError, match="amsgrad"):
        run.opt.load_state_dict(bad)
    wrong = {**saved, "state": {**saved["state"], 0: {**saved["state"][0]}}}
    wrong["state"][0]["exp_avg"] = xp.zeros((3, 3), dtype=xp.float32)
    with pytest.raises(ValueError, match="shape"):
        run.opt.load_state_dict(wrong)


def test_a_jitted_step_keeps_working_after_load_state_dict(url: str) -> None:
    """The loads write into the parameter and state arrays the recorded graph reads:
    replaying the steps after a load gives the steps first run from that state, bit for bit,
    with one graph."""
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        run = Run(Autodiff(xp), "adamw-cosine")
        step = jit(run.step)
        run.train(4, step)
        opt_state = _numpy_copy(run.opt.state_dict())
        model_state = {k: np.asarray(v).copy() for k, v in run.net.state_dict().items()}
        schedule_state, order = run.schedule.state_dict(), run.order.bit_generator.state
        run.train(5, step)
        first = run.weights()
        recorded_with = run.net.state_dict(), run.opt.state_dict()  # alive: ids not reused
        run.net.load_state_dict(model_state)
        run.opt.load_state_dict(opt_state)
        for name, value in run.net.state_dict().items():  # the same arrays, contents loaded
            assert value is recorded_with[0][name]
        for index, entry in run.opt.state_dict()["state"].items():
            for key, value in entry.items():
                assert value is recorded_with[1]["state"][index][key] or key == "step"
        run.schedule.load_state_dict(schedule_state)
        run.order.bit_generator.state = order
        run.train(5, step)
        _assert_same(run.weights(), first)
        assert step.recorded == 1 and step.calls == 14


def _numpy_copy(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": {
            index: {k: np.asarray(v).copy() if hasattr(v, "shape") else v for k, v in e.items()}
            for index, e in state["state"].items()
        },
        "param_groups": [dict(group) for group in state["param_groups"]],
    }


# --- (b) a server killed mid-run, the run resumed on a fresh one -------------------------------
@pytest.mark.server
@pytest.mark.parametrize(("kind", "jitted"), [(k, False) for k in KINDS] + [(KINDS[2], True)])
def test_a_run_resumed_after_sigkill_ends_as_the_uninterrupted_one(
    tmp_path: Path, kind: str, jitted: bool
) -> None:
    total, every = 11, 3
    with run_server("--device", "ndarray:2") as first:
        with client.RemoteDevice(first.url) as dev:
            run = Run(Autodiff(client.namespace(dev)), kind)
            step = jit(run.step) if jitted else None
            while run.done < 7:
                run.train(1, step)
                if run.done % every == 0:
                    run.save(checkpoint.numbered(tmp_path, run.done))
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            with pytest.raises((client.TensorwireError, ConnectionError)):
                run.train(1, step)  # ops are pipelined: the read below finds the loss
                run.weights()
    with run_server("--device", "ndarray:2") as second:
        with client.RemoteDevice(second.url) as dev:
            ad = Autodiff(client.namespace(dev))
            resumed = Run(ad, kind, init=99)  # other weights: they must come from the file
            latest = checkpoint.latest(tmp_path)
            assert latest == checkpoint.numbered(tmp_path, 6)
            assert resumed.load(latest).step == 6
            resumed_step = jit(resumed.step) if jitted else None
            resumed.train(total - resumed.done, resumed_step)
            uninterrupted = Run(ad, kind)
            uninterrupted.train(total, jit(uninterrupted.step) if jitted else None)
            _assert_same(resumed.weights(), uninterrupted.weights())


# --- the file: atomic, typed errors ----------------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path) -> tuple[Run, Path]:
    run = Run(Autodiff(np), "adamw-cosine")
    run.train(3)
    path = tmp_path / "ckpt.safetensors"
    run.save(path)
    return run, path


class _Crash(Exception):
    pass


def test_a_crash_mid_write_leaves_the_previous_checkpoint(
    saved: tuple[Run, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, path = saved
    before = path.read_bytes()
    real_fdopen = os.fdopen

    class HalfWritten:
        """The temporary file: half of what is written reaches it, then the 'crash'."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.file = real_fdopen(*args, **kwargs)

        def __enter__(self) -> HalfWritten:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def write(self, data: bytes) -> int:
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            assert len(list(path.parent.glob(".ckpt.safetensors.*.tmp"))) == 1
            raise _Crash

    run.train(2)
    monkeypatch.setattr(checkpoint.os, "fdopen", HalfWritten)
    with pytest.raises(_Crash):
        run.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the temporary file gone
    fresh = Run(Autodiff(np), "adamw-cosine", init=5)
    assert fresh.load(path).step == 3


def test_missing_corrupt_and_mismatched_checkpoints_raise_typed_errors(
    saved: tuple[Run, Path], tmp_path: Path
) -> None:
    run, path = saved
    with pytest.raises(checkpoint.CheckpointNotFoundError, match="no checkpoint"):
        checkpoint.load(tmp_path / "absent.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(checkpoint.CorruptCheckpointError, match="damaged"):
        checkpoint.load(truncated)
    weights_only = tmp_path / "weights.safetensors"
    run.net.save(weights_only)
    with pytest.raises(checkpoint.CorruptCheckpointError, match="not a checkpoint"):
        checkpoint.load(weights_only)
    other = nn.Sequential(nn.Linear(10, 21), nn.Tanh(), nn.Linear(21, 4))
    with pytest.raises(checkpoint.CheckpointMismatchError, match="does not fit the model"):
        checkpoint.load(path, model=other)
    sgd = optim.SGD(run.net.parameters(), lr=0.1)
    with pytest.raises(checkpoint.CheckpointMismatchError, match="AdamW optimizer, not of a SGD"):
        checkpoint.load(path, optimizer=sgd)
    with pytest.raises(TypeError, match="JSON-able"):
        checkpoint.save(tmp_path / "x.safetensors", model=run.net, extra={"rng": object()})
    assert not (tmp_path / "x.safetensors").exists()


# --- (c) the examples, killed with their server and resumed ------------------------------------
def _example(name: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / name), *args]


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """``command`` to its end: exit status 0 or 1 (the goal reached or not), not 2 (failed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done


def _kill_server_after_checkpoint(command: list[str], server: ServerProcess, step: int) -> None:
    """Run ``command`` until it says it wrote step ``step``'s checkpoint, then SIGKILL its
    server: the example fails with exit status 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    written = f"checkpoint {checkpoint.numbered('.', step).name} written"
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(written):
                os.kill(server.pid, signal.SIGKILL)
                break
        assert proc.wait(timeout=60) == 2  # the server is gone


def _assert_resumed(out: str, step: int) -> None:
    assert "resuming from" in out and f"(step {step})" in out, out


def _assert_same_checkpoints(a: Path | None, b: Path | None) -> None:
    """The two runs' last checkpoints hold the same arrays, bit for bit, and the same extra."""
    assert a is not None and b is not None and a.name == b.name
    first, second = checkpoint.load(a), checkpoint.load(b)
    assert list(first.arrays) == list(second.arrays)
    _assert_same(list(first.arrays.values()), list(second.arrays.values()))
    assert first.extra == second.extra


def _lines(out: str, *starts: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(starts)]


@pytest.mark.e2e
def test_train_mlp_resumes_after_its_server_is_killed(tmp_path: Path) -> None:
    flags = ["--epochs", "2", "--hidden", "32", "--plot", str(tmp_path / "p.png")]
    ckpt = tmp_path / "ckpt"
    with run_server() as first:
        command = _example("train_mlp.py", "--url", first.url, *flags, "--checkpoint", str(ckpt))
        _kill_server_after_checkpoint([*command, "--checkpoint-every", "10"], first, 10)
    with run_server() as second:
        resume = ["--url", second.url, *flags, "--checkpoint", str(ckpt), "--resume"]
        resumed = _run(_example("train_mlp.py", *resume, "--save", str(tmp_path / "r.safetensors")))
        _assert_resumed(resumed.stdout, 10)
        whole = _run(
            _example("train_mlp.py", "--url", second.url, *flags, "--save", str(tmp_path / "w"))
        )
    a, b = nn.load(tmp_path / "r.safetensors"), nn.load(tmp_path / "w")
    assert list(a) == list(b)
    _assert_same(list(a.values()), list(b.values()))
    summary = _lines(whole.stdout, "epoch", "held-out")
    assert _lines(resumed.stdout, "epoch", "held-out") == summary and len(summary) == 3


@pytest.mark.e2e
def test_train_resumes_after_its_server_is_killed(tmp_path: Path) -> None:
    """examples/train.py: its weights and losses in the checkpoint, full-batch steps."""
    flags = ["--steps", "300", "--samples", "256", "--features", "4", "--checkpoint-every", "100"]
    ckpt, whole_ckpt = tmp_path / "ckpt", tmp_path / "whole"
    with run_server() as first:
        command = _example("train.py", "--url", first.url, *flags, "--checkpoint", str(ckpt))
        _kill_server_after_checkpoint(command, first, 100)
    with run_server() as second:
        resumed = _run(
            _example("train.py", "--url", second.url, *flags, "--checkpoint", str(ckpt), "--resume")
        )
        _assert_resumed(resumed.stdout, 100)
        whole = _run(
            _example("train.py", "--url", second.url, *flags, "--checkpoint", str(whole_ckpt))
        )
    _assert_same_checkpoints(checkpoint.latest(ckpt), checkpoint.latest(whole_ckpt))
    assert _lines(resumed.stdout, "final loss") == _lines(whole.stdout, "final loss")
    assert len(checkpoint.load(checkpoint.numbered(ckpt, 300)).extra["losses"]) == 300


@pytest.mark.e2e
def test_train_data_parallel_resumes_into_every_replica_after_its_server_is_killed(
    tmp_path: Path,
) -> None:
    """Two replicas on the two devices of one server: a checkpoint holds one copy of the
    state, the resume loads it into both, and they end bit-identical, as the run never
    interrupted ends."""
    flags = ["--epochs", "2", "--hidden", "32", "--devices-per-server", "2", "--plot"]
    flags += [str(tmp_path / "p.png"), "--checkpoint-every", "10"]
    ckpt, whole_ckpt = tmp_path / "ckpt", tmp_path / "whole"
    name = "train_data_parallel.py"
    with run_server("--device", "ndarray:2") as first:
        command = _example(name, "--url", first.url, *flags, "--checkpoint", str(ckpt))
        _kill_server_after_checkpoint(command, first, 10)
    saved = checkpoint.load(checkpoint.numbered(ckpt, 10))
    assert len(saved.arrays) == 6  # one copy of the model's parameters
    with run_server("--device", "ndarray:2") as second:
        resumed = _run(
            _example(name, "--url", second.url, *flags, "--checkpoint", str(ckpt), "--resume")
        )
        _assert_resumed(resumed.stdout, 10)
        whole = _run(_example(name, "--url", second.url, *flags, "--checkpoint", str(whole_ckpt)))
    _assert_same_checkpoints(checkpoint.latest(ckpt), checkpoint.latest(whole_ckpt))
    assert "replicas bit-identical: yes, all 6 parameters" in resumed.stdout.splitlines()
    summary = _lines(whole.stdout, "epoch", "held-out")
    assert _lines(resumed.stdout, "epoch", "held-out") == summary and len(summary) == 3
