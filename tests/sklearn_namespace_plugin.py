"""pytest plugin: run scikit-learn's own array-API tests against one namespace.

(Copied unchanged in substance from the team's shared tools, so that the suite and CI, which
see only this repository, can run it: tests/test_consumers.py runs scikit-learn's
GaussianMixture array-API tests through it; the full run is ``tools/sklearn_suite.sh``.)

scikit-learn parametrizes its array-API tests over the namespaces it knows (array_api_strict,
torch, cupy, ...). This plugin points that parametrization at the one named by SKLEARN_TEST_NS
(a module name, e.g. ``client.array_api`` or ``array_api_strict``), keeps only the tests that use
it, and leaves everything else as scikit-learn ships it. Nothing in the namespace is patched.

    SKLEARN_TEST_NS=client.array_api TENSORWIRE_URL=ws://127.0.0.1:PORT SCIPY_ARRAY_API=1 \\
      PYTHONPATH=tests:. python -m pytest -p sklearn_namespace_plugin --pyargs sklearn -q

Run it once with array_api_strict as the reference and compare the outcomes test by test
(node ids match once the namespace name in them is replaced). scikit-learn ships its tests in
the wheel; a test that hard-codes array_api_strict appears only in that run.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("SCIPY_ARRAY_API", "1")
NS = os.environ["SKLEARN_TEST_NS"]

import sklearn.utils._array_api as _array_api  # noqa: E402
from sklearn.utils._array_api import NamespaceAndDevice  # noqa: E402


def yield_namespaces(include_numpy_namespaces=True):
    yield NS


def yield_namespace_device_dtype_combinations(include_numpy_namespaces=True):
    yield NS, None, "float64"
    yield NS, None, "float32"


def yield_mixed_namespace_input_permutations():
    yield NamespaceAndDevice("numpy", None), NamespaceAndDevice(NS, None), f"numpy to {NS}"
    yield NamespaceAndDevice(NS, None), NamespaceAndDevice("numpy", None), f"{NS} to numpy"


_REPLACEMENTS = {
    "yield_namespaces": yield_namespaces,
    "yield_namespace_device_dtype_combinations": yield_namespace_device_dtype_combinations,
    "yield_mixed_namespace_input_permutations": yield_mixed_namespace_input_permutations,
}
for _name, _function in _REPLACEMENTS.items():
    setattr(_array_api, _name, _function)
for _module in list(sys.modules.values()):  # modules that imported the names already
    if _module is not None and getattr(_module, "__name__", "").startswith("sklearn"):
        for _name, _function in _REPLACEMENTS.items():
            if hasattr(_module, _name):
                setattr(_module, _name, _function)


def pytest_collection_modifyitems(session, config, items):
    kept = [item for item in items if NS in item.nodeid]
    dropped = [item for item in items if NS not in item.nodeid]
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)
