"""pytest plugin: run SciPy's own array-API tests (the tests that take the `xp` fixture, shipped in
SciPy's wheel) against ONE namespace: Tensorwire's, or array_api_strict / numpy as references.

SciPy's conftest (with SCIPY_ARRAY_API=1) parametrizes `xp` over the libraries it can import and
compares `xp.__name__` with `xp_known_backends` in its skip/xfail markers. When that conftest is
registered, this plugin replaces the `xp` fixture's params by the one namespace named by
SCIPY_TEST_NS, and adds Tensorwire's name to `xp_known_backends`, so `np_only` markers skip it as
they skip every non-NumPy backend. Tensorwire counts as a CPU, eager backend (numpy-backed;
`np.asarray(x)` reads), so cpu_only / eager_only markers do not skip it.

(Copied unchanged in substance from the team's shared tools, so that the suite and the bench,
which see only this repository, can run it: tests/test_consumers.py runs a few SciPy modules'
array-API tests through it; ``python -m bench.scipy_suites`` measures them against
array_api_strict.)

    SCIPY_TEST_NS=client.array_api   (needs TENSORWIRE_URL: a running server's ws:// address)
    SCIPY_TEST_NS=array_api_strict   (the reference)
    SP=$(python -c 'import scipy, os; print(os.path.dirname(scipy.__file__))')
    SCIPY_ARRAY_API=1 PYTHONPATH=tests:. python -m pytest -p scipy_namespace_plugin \\
        -m array_api_backends --rootdir "$SP" "$SP/special/tests" "$SP/stats/tests" ...

Compare the two runs over the node ids both ran; ids carry the namespace in their brackets.
"""

from __future__ import annotations

import importlib
import os

import pytest

os.environ.setdefault("SCIPY_ARRAY_API", "1")
NAME = os.environ.get("SCIPY_TEST_NS", "client.array_api")


def _namespace():
    return importlib.import_module(NAME)


def pytest_plugin_registered(plugin, manager):
    path = getattr(plugin, "__file__", "") or ""
    if not path.endswith("scipy/conftest.py") or getattr(plugin, "_ns_patched", False):
        return
    plugin._ns_patched = True
    mark = pytest.mark.array_api_backends
    if NAME in ("array_api_strict", "numpy"):
        params = [p for p in plugin.xp_available_backends if p.id == NAME]
        assert params, (
            f"{NAME} is not among SciPy's backends {[p.id for p in plugin.xp_available_backends]}"
        )
    else:
        ns = _namespace()
        plugin.xp_known_backends.add(ns.__name__)
        params = [pytest.param(ns, id=NAME, marks=mark)]
    plugin.xp_available_backends = params
    function = plugin.xp._get_wrapped_function()
    plugin.xp = pytest.fixture(params=params)(function)
