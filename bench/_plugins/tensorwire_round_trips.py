"""pytest plugin for ``bench.scipy_suites``: each test's outcome and duration, and for
Tensorwire the client's round trips by kind, written as JSON to ``$SCIPY_SUITES_OUT`` when the
session ends.

A round trip is a blocking wait: a reply's ``result()`` called while the reply has not arrived,
unless its request was sent before the last counted wait began (it was in flight then: the
requests sent together count once). Its kind is read from the
stack when it happens: array-api-compat's ``is_lazy_array`` probe if it is on the stack, else
the outermost client entry point that waited: ``shape`` (a data-dependent shape's describe),
``bool``, ``to_numpy`` (``np.asarray``, ``__array__``, DLPack), ``scalar`` (``float``, ``int``,
``complex``, ``operator.index``), ``read`` (``x.numpy()``), ``other`` (sync, stats, ...).

This module is loaded by name (``-p tensorwire_round_trips``) from its own folder, so that it
measures whichever checkout's ``client`` comes first on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from typing import Any

import pytest

_SITES = bool(os.environ.get("SCIPY_SUITES_SITES"))

KINDS = {
    "describe": "shape",
    "__bool__": "bool",
    "__array__": "to_numpy",
    "__dlpack__": "to_numpy",
    "__float__": "scalar",
    "__int__": "scalar",
    "__complex__": "scalar",
    "__index__": "scalar",
    "_scalar": "scalar",
    "numpy": "read",
}
_current: str | None = None
_trips: dict[str, Counter[str]] = {}
_outcomes: dict[str, str] = {}
_durations: dict[str, float] = {}
_horizon: dict[int, int] = {}  # connection -> the last message sent when a counted wait began
_sites: Counter[str] = Counter()  # with $SCIPY_SUITES_SITES set: kind and the caller's line


def _kind() -> str:
    frame: Any = sys._getframe(2)
    kind = "other"
    while frame is not None:
        code = frame.f_code
        if code.co_name == "is_lazy_array":
            return "is_lazy_array"
        if code.co_name in KINDS and f"{os.sep}client{os.sep}" in code.co_filename:
            kind = KINDS[code.co_name]  # the outermost wins: bool() that reads is bool
        frame = frame.f_back
    return kind


def _site(kind: str) -> str:
    """``kind`` and the innermost line outside Tensorwire's client, numpy and the compat layers
    that led to the round trip."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(p in name for p in _LIBRARIES):
            return (
                f"{kind} {name.split('site-packages/')[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
            )
        frame = frame.f_back
    return kind


_LIBRARIES = (f"{os.sep}client{os.sep}", "numpy", "array_api_compat", "array_api_extra", "_plugins")


def _install() -> None:
    try:
        from client._replies import Reply
    except ImportError:  # a run of a reference namespace
        return
    result = Reply.result

    def counted_result(self: Any, timeout: float | None = None) -> Any:
        sent = getattr(self._conn, "_batches", None)  # messages sent: all in flight now
        horizon = _horizon.get(id(self._conn), -1)
        if not self.done() and (sent is None or self.batch > horizon):
            _horizon[id(self._conn)] = -1 if sent is None else sent
            kind = _kind()
            _trips.setdefault(_current or "(outside tests)", Counter())[kind] += 1
            if _SITES:
                _sites[_site(kind)] += 1
        return result(self, timeout)

    Reply.result = counted_result  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    global _current
    _current = item.nodeid
    yield
    _current = None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "call" or report.outcome != "passed":
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        if _outcomes.get(report.nodeid) != "failed":
            _outcomes[report.nodeid] = outcome
    _outcomes.setdefault(report.nodeid, report.outcome)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("SCIPY_SUITES_OUT")
    if not path:
        return
    tests = {
        nodeid: {
            "outcome": outcome,
            "seconds": round(_durations.get(nodeid, 0.0), 4),
            "trips": dict(_trips.get(nodeid, {})),
        }
        for nodeid, outcome in _outcomes.items()
    }
    outside = dict(_trips.get("(outside tests)", {}))
    with open(path, "w") as out:
        sites = dict(_sites.most_common(200))
        json.dump(
            {"finished": time.time(), "tests": tests, "outside": outside, "sites": sites}, out
        )
