"""SciPy's own array-API tests against Tensorwire and against array_api_strict, in one sitting.

For each chosen module, SciPy's tests that take ``xp`` (``SCIPY_ARRAY_API=1``, the plugin
``../shared/tools/scipy_namespace_plugin.py``) run twice, each run a pytest process of its own:
once with array_api_strict, once with Tensorwire's ``client.array_api`` against a fresh
``python -m server --device ndarray`` on a free loopback port. Compared over the node ids both
ran: passed and failed counts, the time of the tests neither skipped (pytest's durations, setup
and teardown included) and of the whole process, and Tensorwire's round trips by kind, counted by
``bench/_plugins/tensorwire_round_trips.py`` (a blocking wait for a reply is one round trip).

    python -m bench.scipy_suites                          # the default modules
    python -m bench.scipy_suites cluster "optimize:test_bracket.py,test_chandrupatla.py"
    python -m bench.scipy_suites "stats:test_morestats.py@TestLevene or TestBartlett"
    python -m bench.scipy_suites --repo ../i31-before --label before cluster
    python -m bench.scipy_suites --compare bench/runs/scipy/A.json bench/runs/scipy/B.json

A module is ``NAME[:FILE,FILE...][@KEXPR]``: SciPy's ``NAME/tests`` (or those files in it),
``-k KEXPR`` if given. ``--repo`` is the Tensorwire checkout whose server and client are
measured (default: this one), so old code can be measured by this tool. Progress goes to
stderr, the table to stdout, the JSON to ``bench/runs/scipy/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import scipy  # type: ignore[import-untyped]

from . import _procs

ROOT = Path(__file__).resolve().parent.parent
SCIPY = Path(scipy.__file__).parent
PLUGINS = (ROOT / "tests", ROOT / "bench" / "_plugins")  # SciPy's plugin, the counter
RUNS = ROOT / "bench" / "runs" / "scipy"
DEFAULT_MODULES = (
    "cluster",
    "integrate",
    "interpolate",
    "spatial/transform",  # spatial's array-API tests are its transforms'
    "special",
    "optimize:test_bracket.py,test_chandrupatla.py,test_zeros.py",
)
NAMESPACES = {"strict": "array_api_strict", "tensorwire": "client.array_api"}
KINDS = ("shape", "bool", "to_numpy", "scalar", "read", "is_lazy_array", "other")


def parse_module(spec: str) -> tuple[str, list[Path], str | None]:
    """``NAME[:FILE,...][@KEXPR]`` as SciPy's module name, its test paths and the -k filter."""
    head, _, kexpr = spec.partition("@")
    name, _, files = head.partition(":")
    tests = SCIPY / name / "tests"
    paths = [tests / f for f in files.split(",")] if files else [tests]
    for path in paths:
        if not path.exists():
            raise SystemExit(f"no such SciPy test path: {path}")
    return name, paths, kexpr or None


def run_pytest(
    spec: str, namespace: str, repo: Path, url: str | None, timeout: float
) -> dict[str, Any]:
    """One pytest process over ``spec`` with ``namespace``; what the plugin recorded, and the
    process's wall time. Progress on stderr every 15 s."""
    name, paths, kexpr = parse_module(spec)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = dict(
            os.environ,
            SCIPY_ARRAY_API="1",
            SCIPY_TEST_NS=namespace,
            SCIPY_SUITES_OUT=str(out),
            PYTHONPATH=os.pathsep.join([str(repo), *map(str, PLUGINS)]),
        )
        if url is not None:
            env["TENSORWIRE_URL"] = url
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")
        argv = [sys.executable, "-m", "pytest", "-c", str(Path(tmp) / "pytest.ini")]
        argv += ["-p", "scipy_namespace_plugin", "-p", "tensorwire_round_trips"]
        argv += ["-p", "no:cacheprovider", "-m", "array_api_backends", "-q"]
        argv += ["--rootdir", str(SCIPY), *map(str, paths)]
        if kexpr:
            argv += ["-k", kexpr]
        label = f"{name} [{namespace}]"
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        tail = _follow(proc, label, started, timeout)
        wall = time.perf_counter() - started
        if not out.exists():
            raise RuntimeError(f"{label}: pytest wrote no results (rc {proc.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads(out.read_text())
    result.update(wall_s=round(wall, 2), returncode=proc.returncode, summary=tail[-1:])
    print(f"  {label}: {tail[-1] if tail else '?'} ({wall:.1f} s)", file=sys.stderr)
    return result


def _follow(proc: subprocess.Popen[str], label: str, started: float, timeout: float) -> list[str]:
    """Read ``proc``'s output, printing a progress line every 15 s; its last lines."""
    lines: list[str] = []
    marks = Counter[str]()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    last = started
    assert proc.stdout is not None
    for line in proc.stdout:
        lines = [*lines[-30:], line.rstrip()]
        if re.fullmatch(r"[.FEsxX]+(\s+\[\s*\d+%\])?\s*", line):
            marks.update(c for c in line if c in ".FEsxX")
        now = time.perf_counter()
        if now - last > 15:
            last = now
            done, failed = sum(marks.values()), marks["F"] + marks["E"]
            print(
                f"  {label}: {done} tests, {failed} failed, {now - started:.0f} s", file=sys.stderr
            )
    proc.wait()
    timer.cancel()
    return [line for line in lines if line]


def _common_id(nodeid: str) -> str:
    for namespace in NAMESPACES.values():
        nodeid = nodeid.replace(namespace, "NS")
    return nodeid


def compare(strict: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """The two runs over the node ids both ran."""
    s = {_common_id(k): v for k, v in strict["tests"].items()}
    t = {_common_id(k): v for k, v in ours["tests"].items()}
    common = sorted(s.keys() & t.keys())
    ran = [k for k in common if "skipped" not in (s[k]["outcome"], t[k]["outcome"])]
    trips = Counter[str]()
    for k in common:
        trips.update(t[k]["trips"])
    return {
        "tests": len(common),
        "passed": {
            "strict": _count(s, common, "passed"),
            "tensorwire": _count(t, common, "passed"),
        },
        "failed": {
            "strict": _count(s, common, "failed"),
            "tensorwire": _count(t, common, "failed"),
        },
        "ran": len(ran),  # neither skipped: the tests the seconds are of
        "seconds": {
            "strict": round(sum(s[k]["seconds"] for k in ran), 2),
            "tensorwire": round(sum(t[k]["seconds"] for k in ran), 2),
        },
        "wall_s": {"strict": strict["wall_s"], "tensorwire": ours["wall_s"]},
        "trips": dict(trips),
        "trips_outside_tests": ours.get("outside", {}),
        "sites": ours.get("sites", {}),
        "failed_ids": {
            "tensorwire": [k for k in common if t[k]["outcome"] == "failed"],
            "strict": [k for k in common if s[k]["outcome"] == "failed"],
        },
        "trips_per_test": {k: sum(t[k]["trips"].values()) for k in common if t[k]["trips"]},
    }


def _count(tests: dict[str, Any], ids: list[str], outcome: str) -> int:
    return sum(1 for k in ids if tests[k]["outcome"] == outcome)


def table(modules: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| module | tests | passed TW / strict | failed TW / strict | ran | s TW / strict (ratio) "
        "| round trips (per test) | " + " | ".join(KINDS) + " |",
        "|---" * (7 + len(KINDS)) + "|",
    ]
    for name, m in modules.items():
        p, f, s, trips = m["passed"], m["failed"], m["seconds"], m["trips"]
        total = sum(trips.values())
        ratio = s["tensorwire"] / s["strict"] if s["strict"] else float("nan")
        per = total / m["tests"] if m["tests"] else 0.0
        rows.append(
            f"| {name} | {m['tests']} | {p['tensorwire']} / {p['strict']} "
            f"| {f['tensorwire']} / {f['strict']} | {m['ran']} "
            f"| {s['tensorwire']:.1f} / {s['strict']:.1f} ({ratio:.2f}x) | {total} ({per:.1f}) | "
            + " | ".join(str(trips.get(k, 0)) for k in KINDS)
            + " |"
        )
    return "\n".join(rows)


def compare_files(before: Path, after: Path) -> str:
    """Round trips and time of two runs of this tool, module by module."""
    a, b = (json.loads(p.read_text())["modules"] for p in (before, after))
    rows = [
        "| module | round trips before -> after | ratio | s TW/strict before -> after "
        "| passed TW before -> after (strict) |",
        "|---|---|---|---|---|",
    ]
    for name in a.keys() & b.keys():
        ta, tb = sum(a[name]["trips"].values()), sum(b[name]["trips"].values())
        ra, rb = (
            m["seconds"]["tensorwire"] / max(m["seconds"]["strict"], 1e-9)
            for m in (a[name], b[name])
        )
        rows.append(
            f"| {name} | {ta} -> {tb} | {tb / max(ta, 1):.2f} | {ra:.2f}x -> {rb:.2f}x "
            f"| {a[name]['passed']['tensorwire']} -> {b[name]['passed']['tensorwire']} "
            f"({b[name]['passed']['strict']}) |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scipy_suites", description=__doc__)
    parser.add_argument("modules", nargs="*", default=list(DEFAULT_MODULES))
    parser.add_argument(
        "--repo", type=Path, default=ROOT, help="the Tensorwire checkout to measure"
    )
    parser.add_argument("--label", default="", help="a word for the JSON file's name")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per pytest run")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        print(compare_files(*args.compare))
        return
    repo = args.repo.resolve()
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"SciPy {scipy.__version__}, Tensorwire at {repo} ({commit})", file=sys.stderr)
    modules: dict[str, dict[str, Any]] = {}
    for spec in args.modules:
        strict = run_pytest(spec, NAMESPACES["strict"], repo, None, args.timeout)
        with _procs.server("--device", "ndarray", repo=repo, env=_env(repo)) as (url, _):
            ours = run_pytest(spec, NAMESPACES["tensorwire"], repo, url, args.timeout)
        modules[spec] = compare(strict, ours)
    print(table(modules))
    RUNS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = RUNS / f"{stamp}-{args.label or commit}.json"
    info = {"scipy": scipy.__version__, "repo": str(repo), "commit": commit, "argv": args.modules}
    path.write_text(json.dumps({**info, "modules": modules}, indent=1))
    print(f"written: {path.relative_to(ROOT)}", file=sys.stderr)


def _env(repo: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(repo))


if __name__ == "__main__":
    main()
