"""The benchmark suite works: ``python -m bench --quick`` runs every workload and writes JSON.

Never that anything is fast: figures and goals are checked for shape and consistency only.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import client
from bench import __main__ as bench_main
from bench import compute, consumer, latency
from bench._report import Goal, Stat

ROOT = Path(__file__).resolve().parent.parent
# Goals pinned per figure (None: an explanatory row), so that changing one changes this test
JUDGED_GOALS = {
    ("upload 1 MiB float32", "throughput / the floor"): {"op": ">=", "value": 0.6},
    ("upload 1 MiB float32", "throughput / plain TCP"): None,  # judged against the floor
    ("upload 4 MiB float32", "throughput / plain TCP"): {"op": ">=", "value": 0.6},
    ("upload 64 x 1 MiB float32, then one sync", "throughput / plain TCP"): {
        "op": ">=",
        "value": 0.55,
    },
    ("read one-element tensor", "median round trip / floor round trip"): None,
    ("read one-element tensor", "median round trip / ping-pong"): {"op": "<=", "value": 1.2},
    ("read one-element tensor", "server CPU per read (us)"): None,
}


@pytest.mark.e2e
def test_quick_run_writes_every_workload(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["quick"] is True
    assert data["failures"] == []
    figures = data["figures"]
    # three figures per throughput direction and size (quick: 2 sizes): ours and websockets
    # alone against TCP, ours against TCP into a reused array; the upload floor per size, and
    # ours against it at 1 MiB; the streamed uploads; then one to five per workload (latency:
    # 5, pipelined: 2, the consumer: 3, training: 2 for the digits MLP and 1 for the wide one,
    # step replay: 2 for the digits MLP and 1 for the wide one; the examples' CNN and
    # transformer: 2 each, replayed and op by op; several servers: 3 for a transfer between
    # two, 1 for data-parallel training)
    assert len(figures) == 12 + 2 + 1 + 1 + 1 + 5 + 2 + 1 + 1 + 1 + 1 + 1 + 3 + 3 + 3 + 4 + 4
    for figure in figures:
        assert math.isfinite(figure["value"])
        measured = figure["measured"]
        assert measured["min"] <= measured["median"] <= measured["max"]
        if figure["goal"] is not None:
            goal = Goal(figure["goal"]["op"], figure["goal"]["value"])
            assert figure["met"] is goal.met(figure["value"])
    judged = {f["workload"].split()[0] for f in figures if f["goal"] is not None}
    assert {"upload", "download", "read", "idle"} <= judged
    goals = {(f["workload"], f["figure"]): (f["goal"], f["value"]) for f in figures}
    for key, wanted in JUDGED_GOALS.items():
        assert goals[key][0] == wanted and goals[key][1] > 0, key
    fit = {f["figure"]: f for f in figures if f["workload"].startswith("CalibratedClass")}
    trips = fit["blocking round trips per fit"]["value"]
    assert trips == int(trips) > 0
    assert 0 < fit["time waiting on them / remote fit time"]["value"] < 1
    training = {
        (f["workload"].split(",")[0], f["figure"]): f
        for f in figures
        if f["workload"].startswith("training")
    }
    wide = training[("training: MLP 512-1024-1024-10", "remote steps/s / local numpy")]
    assert wide["goal"] == {"op": ">=", "value": 0.9}  # a step of real work (>= 10 ms of numpy)
    digits = "training: MLP 64-128-128-10"
    assert training[(digits, "remote steps/s / local numpy")]["goal"] is None  # reported
    assert training[(digits, "client CPU, us per step")]["value"] > 0
    steps = [f for f in figures if f["workload"].startswith("training step: ")]
    assert {f["workload"].split(",")[0] for f in steps} == {
        "training step: CNN of train_cnn.py",
        "training step: transformer of train_transformer.py",
    }
    for figure in steps:  # the goal judges the replayed step; op by op is reported
        replayed = figure["figure"] == "replayed steps/s / local numpy"
        assert figure["goal"] == ({"op": ">=", "value": 0.9} if replayed else None)
    assert "Tensorwire benchmarks" in done.stdout


@pytest.mark.e2e
def test_ratio_figures_divide_medians_measured_in_the_same_run(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert bench_main.main(["--quick", "--only", "transfer", "--json", str(out)]) == 0
    references = set()
    for figure in json.loads(out.read_text())["figures"]:  # ours, websockets, floor, streamed
        expected = figure["measured"]["median"] / figure["reference"]["median"]
        assert figure["value"] == expected
        references.add(figure["reference_name"])
    assert references == {"TCP loopback", "TCP into a reused array", "the floor"}


@pytest.mark.e2e
def test_a_failed_workload_is_reported_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(dev: client.RemoteDevice, *args: object) -> list[object]:
        dev.close()  # the next workload must not inherit a broken session
        raise ConnectionError("keepalive ping timeout\nsecond line")

    monkeypatch.setattr(latency, "reads", broken)
    out = tmp_path / "r.json"
    argv = ["--quick", "--markdown", "--only", "latency", "--only", "pipelined"]
    assert bench_main.main([*argv, "--json", str(out)]) == 1  # non-zero: something failed
    data = json.loads(out.read_text())
    error = "ConnectionError: keepalive ping timeout"
    assert data["failures"] == [{"workload": "latency", "error": error}]
    pipelined = [f["workload"] for f in data["figures"]]
    assert len(pipelined) == 2 and all("pipelined adds" in name for name in pipelined)
    table = capsys.readouterr().out.splitlines()
    assert f"| latency | failed | - |  | NO | {error} |  |" in table
    assert sum(f"| {pipelined[0]} |" in line for line in table) == 1


@pytest.mark.e2e
def test_ctrl_c_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def interrupted(*args: object) -> list[object]:
        raise KeyboardInterrupt

    monkeypatch.setattr(latency, "reads", interrupted)
    monkeypatch.setattr(compute, "pipelined", lambda *args: ran.append("pipelined") or [])
    argv = ["--quick", "--only", "latency", "--only", "pipelined", "--json", str(tmp_path / "r")]
    with pytest.raises(KeyboardInterrupt):
        bench_main.main(argv)
    assert ran == [] and not (tmp_path / "r").exists()


def test_consumer_counts_requests_sent_together_as_one_round_trip(dev: client.RemoteDevice) -> None:
    xp = client.namespace(dev)
    a, b = xp.ones(3), xp.zeros(2)
    with consumer.counting(dev) as tally:
        dev.describe([a.tensor_id, b.tensor_id])  # two requests, pipelined
        a.numpy()
        dev.sync()
    assert tally.requests == {"Describe": 2, "Read": 1, "Sync": 1}
    assert tally.trips == {"Describe": 1, "Read": 1, "Sync": 1}
    assert tally.round_trips == 3 and tally.waited > 0
    assert not {"request", "wait"} & set(vars(dev._conn))  # the patches are gone
    a.numpy()
    assert tally.round_trips == 3


def test_stat_summarises_median_extremes_and_tail() -> None:
    stat = Stat.of([float(i) for i in range(1, 101)], "us", p99=True)
    assert (stat.median, stat.min, stat.max, stat.n, stat.p99) == (50.5, 1.0, 100.0, 100, 100.0)
    assert not Goal("<=", 1.5).met(1.6)
    assert Goal(">=", 0.6).met(0.6)


@pytest.mark.e2e
def test_cpu_microbenchmark_reports_each_side() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu"], cwd=ROOT, capture_output=True, text=True, timeout=110
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    sides = ["client: build op", "client: build op, origins on", "client: batch + encode"]
    sides += ["server: decode + check + run", "client: segment key", "server: run_segment"]
    expected = ["x = x + a:", *sides, "x = x + 1.0:", *sides]
    assert [line.strip().split("  ")[0] for line in lines] == expected
    figures = [line for line in lines if line.startswith("  ")]
    assert len(figures) == 12 and all(float(line.split()[-2]) > 0 for line in figures)


@pytest.mark.e2e
@pytest.mark.timeout(300)  # records and times three models' steps: its run may take 240 s
def test_cpu_by_kind_reports_every_kind_of_the_training_steps() -> None:
    """``bench.cpu --kinds``: a row for each op kind the recorded steps use (but uploads), each
    with positive figures, measured on its first workload, and one line per step."""
    from bench._step_ops import kind, recordings

    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu", "--kinds", "--reps", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    split = lines.index("server CPU per training step (decode + check + run):")
    rows = [line.split() for line in lines[2:split]]
    firsts: dict[str, str] = {}
    for rec in recordings():
        for op in rec.step_ops:
            firsts.setdefault(kind(op), rec.model.split()[0])
    del firsts["from_buffer"]
    assert {row[-5]: row[0] for row in rows} == firsts
    assert all(float(figure) > 0 for row in rows for figure in row[-3:])
    steps = [line.split()[0] for line in lines[split + 1 :]]
    assert steps == ["digits", "CNN", "transformer"]


def test_profile_summary_counts_own_and_total_samples() -> None:
    from bench.profile import summarize

    text = summarize("main (a.py:1);f (a.py:2) 3\nmain (a.py:1);g (a.py:3) 1\n")
    assert text.startswith("4 samples")
    own, total = text.split("total samples")
    assert "3  75.0%  f (a.py:2)" in own and "1  25.0%  g (a.py:3)" in own
    assert "4 100.0%  main (a.py:1)" in total


def test_summary_puts_runs_side_by_side_and_marks_missed_goals() -> None:
    from bench.summary import table

    def run(value: float, met: bool, failed: tuple[str, ...] = ()) -> dict[str, object]:
        figure = {
            "workload": "100 idle sessions",
            "figure": "KiB each",
            "value": value,
            "goal": {"op": "<=", "value": 200},
            "met": met,
        }
        failures = [{"workload": name, "error": "RuntimeError: no"} for name in failed]
        meta = {"load_before": "1.0 1 1", "load_after": "2.0 2 2"}
        return {"meta": meta, "figures": [figure], "failures": failures}

    runs = [run(25, True), run(250, False, ("latency",))]
    lines = table(runs, ["a", "b"]).splitlines()
    assert lines[0] == "| figure (goal) | a<br>load 1.0-2.0 | b<br>load 1.0-2.0 |"
    assert lines[2] == "| idle sessions: KiB each (<= 200) | 25 | 250 * |"
    assert lines[3] == "| latency: failed |  | failed |"
