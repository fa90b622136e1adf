"""Existing array code runs unchanged: the Array API standard's real consumers (scikit-learn
with ``array_api_dispatch``, SciPy's array-API functions, array-api-extra, array-api-compat)
on Tensorwire arrays through a real server, each compared with the same call on numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import array_api_compat
import array_api_extra as xpx
import numpy as np
import pytest
import scipy
import sklearn
from scipy import cluster, fft, integrate, interpolate, signal, special, stats
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score, mean_absolute_error, r2_score
from sklearn.metrics.pairwise import euclidean_distances
from sklearn.mixture import GaussianMixture

import client

from .servers import ROOT, ServerProcess

RNG = np.random.default_rng(0)
X = RNG.normal(size=(120, 4)) + np.repeat(np.eye(3, 4) * 3, 40, axis=0)
Y = np.repeat(np.arange(3), 40)


def local(value: Any) -> Any:
    """A result as numpy: remote arrays are read, numpy arrays and numbers kept."""
    if isinstance(value, client.RemoteArray):
        return value.numpy()
    return np.asarray(value)


@pytest.fixture
def dispatch() -> Iterator[None]:
    with sklearn.config_context(array_api_dispatch=True):
        yield


# --- array-api-compat: what every consumer calls first --------------------------------------


def test_array_api_compat_sees_a_namespace_and_its_arrays(xp: client.Namespace) -> None:
    x = xp.asarray(X)
    assert array_api_compat.array_namespace(x, xp.asarray(Y)) is xp
    assert array_api_compat.is_array_api_obj(x)
    assert array_api_compat.device(x) is x.device
    assert array_api_compat.to_device(x, x.device) is x
    assert array_api_compat.size(x) == X.size
    assert not array_api_compat.is_numpy_namespace(xp)
    assert array_api_compat.is_writeable_array(x)
    assert not array_api_compat.is_lazy_array(x)


def test_numpy_objects_get_a_clear_error(xp: client.Namespace) -> None:
    """numpy 2 arrays say ``device == "cpu"``; where one reaches the remote namespace, it is
    named in the error."""
    cpu = array_api_compat.device(np.ones(2))
    with pytest.raises(ValueError, match="'cpu' is not a Tensorwire device"):
        xp.zeros(3, device=cpu)
    with pytest.raises(ValueError, match="'cpu' is not a Tensorwire device"):
        xp.asarray(X).to_device(cpu)
    for call in (lambda: xp.sum(np.ones(3)), lambda: xp.astype(np.ones(3), xp.float32)):
        with pytest.raises(TypeError, match="numpy.ndarray: move it to the device first"):
            call()


def test_numpys_method_names_that_array_api_compat_calls(xp: client.Namespace) -> None:
    x = xp.asarray(X)
    assert x.astype(dtype=xp.float64, copy=False) is x
    y = x.astype(dtype=xp.float32, copy=True)
    np.testing.assert_array_equal(y.numpy(), X.astype(np.float32))
    copied = x.copy()
    copied[...] = 0.0
    np.testing.assert_array_equal(x.numpy(), X)
    np.testing.assert_array_equal(x.ravel().numpy(), X.ravel())
    np.testing.assert_array_equal(x.max(axis=-1, keepdims=True).numpy(), X.max(-1, keepdims=True))
    np.testing.assert_array_equal(x.min().numpy(), X.min())


# --- scikit-learn ---------------------------------------------------------------------------


def _fitted(make: Callable[[], Any], xp: client.Namespace, y: bool = True) -> tuple[Any, Any]:
    """The same estimator fitted on numpy and, with dispatch on, on the remote arrays."""
    ours = make().fit(xp.asarray(X), xp.asarray(Y) if y else None)
    theirs = make().fit(X, Y if y else None)
    return ours, theirs


@pytest.mark.usefixtures("dispatch")
def test_linear_discriminant_analysis(xp: client.Namespace) -> None:
    ours, theirs = _fitted(lambda: LinearDiscriminantAnalysis(solver="svd"), xp)
    assert isinstance(ours.coef_, client.RemoteArray)
    np.testing.assert_allclose(local(ours.coef_), theirs.coef_, rtol=1e-10)
    np.testing.assert_array_equal(local(ours.predict(xp.asarray(X))), theirs.predict(X))
    np.testing.assert_allclose(
        local(ours.transform(xp.asarray(X))), theirs.transform(X), rtol=1e-9, atol=1e-12
    )


@pytest.mark.usefixtures("dispatch")
def test_pca(xp: client.Namespace) -> None:
    ours, theirs = _fitted(lambda: PCA(n_components=2, svd_solver="full"), xp, y=False)
    np.testing.assert_allclose(local(ours.components_), theirs.components_, rtol=1e-9)
    np.testing.assert_allclose(local(ours.explained_variance_), theirs.explained_variance_)
    np.testing.assert_allclose(
        local(ours.transform(xp.asarray(X))), theirs.transform(X), rtol=1e-9, atol=1e-12
    )


@pytest.mark.usefixtures("dispatch")
def test_ridge(xp: client.Namespace) -> None:
    ours = Ridge(alpha=0.5, solver="svd").fit(xp.asarray(X), xp.asarray(X[:, 0] * 2.0 + 1.0))
    theirs = Ridge(alpha=0.5, solver="svd").fit(X, X[:, 0] * 2.0 + 1.0)
    np.testing.assert_allclose(local(ours.coef_), theirs.coef_, rtol=1e-10)
    np.testing.assert_allclose(float(ours.intercept_), theirs.intercept_, rtol=1e-10)


@pytest.mark.usefixtures("dispatch")
def test_logistic_regression(xp: client.Namespace) -> None:
    ours, theirs = _fitted(lambda: LogisticRegression(max_iter=200), xp)
    np.testing.assert_allclose(local(ours.coef_), theirs.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(local(ours.predict(xp.asarray(X))), theirs.predict(X))


@pytest.mark.usefixtures("dispatch")
@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_gaussian_mixture(xp: client.Namespace, covariance_type: str) -> None:
    """``full`` writes the regularization through ``covariances[k]`` views (a Cholesky
    error here while writes through views did not reach their base)."""

    def make() -> GaussianMixture:
        return GaussianMixture(
            n_components=3,
            covariance_type=covariance_type,
            init_params="random_from_data",
            random_state=0,
            max_iter=200,
        )

    ours, theirs = _fitted(make, xp, y=False)
    np.testing.assert_allclose(local(ours.means_), theirs.means_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(local(ours.covariances_), theirs.covariances_, rtol=1e-6)
    np.testing.assert_array_equal(local(ours.predict(xp.asarray(X))), theirs.predict(X))


@pytest.mark.usefixtures("dispatch")
def test_metrics(xp: client.Namespace) -> None:
    truth, guess = X[:, 0], X[:, 0] + X[:, 1] * 0.1
    labels, predicted = Y, (Y + (X[:, 2] > 1)) % 3
    for metric, a, b in [
        (r2_score, truth, guess),
        (mean_absolute_error, truth, guess),
        (accuracy_score, labels, predicted),
    ]:
        assert float(metric(xp.asarray(a), xp.asarray(b))) == pytest.approx(metric(a, b))
    np.testing.assert_allclose(
        local(euclidean_distances(xp.asarray(X[:10]), xp.asarray(X[10:20]))),
        euclidean_distances(X[:10], X[10:20]),
        rtol=1e-9,
    )


# --- SciPy's array-API functions ------------------------------------------------------------

SIGNAL = RNG.normal(size=300)
KERNEL = RNG.normal(size=41)
POSITIVE = RNG.uniform(0.1, 2.0, size=(5, 60))
SCIPY_CALLS: dict[str, Callable[[Callable[[Any], Any]], Any]] = {
    "special.logsumexp": lambda a: special.logsumexp(a(POSITIVE), axis=1),
    "special.rel_entr": lambda a: special.rel_entr(a(POSITIVE), a(POSITIVE[::-1])),
    "stats.zscore": lambda a: stats.zscore(a(POSITIVE), axis=1),
    "stats.moment": lambda a: stats.moment(a(POSITIVE), order=3, axis=1),
    "signal.fftconvolve": lambda a: signal.fftconvolve(a(SIGNAL), a(KERNEL)),
    "signal.oaconvolve": lambda a: signal.oaconvolve(a(SIGNAL), a(KERNEL)),  # views: +=
    "cluster.vq.whiten": lambda a: cluster.vq.whiten(a(POSITIVE.T)),
    "fft.rfft": lambda a: fft.rfft(a(SIGNAL)),
    "integrate.trapezoid": lambda a: integrate.trapezoid(a(POSITIVE), axis=1),
    # compiled code: it needs aligned, C-contiguous arrays back from reads
    "interpolate.make_interp_spline": lambda a: interpolate.make_interp_spline(
        a(np.linspace(0.0, 1.0, 30)), a(np.sin(np.linspace(0.0, 3.0, 30)))
    )(a(np.linspace(0.0, 1.0, 7))),
}


@pytest.mark.parametrize("name", list(SCIPY_CALLS))
def test_scipy(xp: client.Namespace, name: str) -> None:
    ours = SCIPY_CALLS[name](xp.asarray)
    theirs = SCIPY_CALLS[name](np.asarray)
    assert isinstance(ours, client.RemoteArray), type(ours)
    np.testing.assert_allclose(local(ours), theirs, rtol=1e-10, atol=1e-12)


def test_scipy_is_on_its_array_api_path() -> None:
    assert scipy._lib._array_api.SCIPY_ARRAY_API  # set by tests/conftest.py before the import


# --- array-api-extra ------------------------------------------------------------------------

XPX_CALLS: dict[str, Callable[[Any, Callable[[Any], Any]], Any]] = {
    "cov": lambda xp, a: xpx.cov(a(POSITIVE), xp=xp),
    "atleast_nd": lambda xp, a: xpx.atleast_nd(a(SIGNAL), ndim=3, xp=xp),
    "kron": lambda xp, a: xpx.kron(a(POSITIVE[:2, :3]), a(np.eye(2)), xp=xp),
    "nunique": lambda xp, a: xpx.nunique(a(Y), xp=xp),
    "pad": lambda xp, a: xpx.pad(a(POSITIVE), 2, xp=xp),
    "setdiff1d": lambda xp, a: xpx.setdiff1d(a(Y), a(np.array([1])), xp=xp),
    "sinc": lambda xp, a: xpx.sinc(a(SIGNAL), xp=xp),
    "create_diagonal": lambda xp, a: xpx.create_diagonal(a(SIGNAL[:5]), xp=xp),
    "isclose": lambda xp, a: xpx.isclose(a(SIGNAL), a(SIGNAL + 1e-9), xp=xp),
    "one_hot": lambda xp, a: xpx.one_hot(a(Y), 3, xp=xp),
    "apply_where": lambda xp, a: xpx.apply_where(
        a(SIGNAL) > 0, (a(SIGNAL),), xp.sqrt, fill_value=-1.0, xp=xp
    ),
}


@pytest.mark.parametrize("name", list(XPX_CALLS))
def test_array_api_extra(xp: client.Namespace, name: str) -> None:
    ours = XPX_CALLS[name](xp, xp.asarray)
    theirs = XPX_CALLS[name](np, np.asarray)
    np.testing.assert_allclose(local(ours), theirs, rtol=1e-12)
    assert np.asarray(local(ours)).dtype == np.asarray(theirs).dtype


def test_array_api_extra_at_writes_through_a_view(xp: client.Namespace) -> None:
    """``xpx.at(x, i).set(v)`` writes in place on a writeable array (array-api-compat's
    ``is_writeable_array``), so a view of ``x`` changes with it, as with numpy."""
    ours, theirs = xp.asarray(POSITIVE), POSITIVE.copy()
    row, row_np = ours[1], theirs[1]
    xpx.at(row, slice(0, 3)).set(0.0)
    xpx.at(row_np, slice(0, 3)).set(0.0)
    xpx.at(ours, (2, slice(None))).add(10.0)
    xpx.at(theirs, (2, slice(None))).add(10.0)
    np.testing.assert_array_equal(ours.numpy(), theirs)


# --- scikit-learn's own array-API tests -----------------------------------------------------


def run_as_shipped(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    """``python -m pytest ARGS`` outside this project's pytest settings (an empty ini), in
    ``tmp_path`` with ``env`` added: its passed count and summary line, once it passed."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "-q", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=tmp_path,
        timeout=600,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return int(summary.split(" passed")[0].split()[-1]), summary


def test_scikit_learns_own_gaussian_mixture_tests(server: ServerProcess, tmp_path: Path) -> None:
    """scikit-learn's array-API tests of GaussianMixture, parametrized over Tensorwire's
    namespace as they are over array_api_strict (tests/sklearn_namespace_plugin.py), run as
    scikit-learn ships them: outside this project's pytest settings (an empty ini)."""
    env = dict(
        SKLEARN_TEST_NS="client.array_api",
        TENSORWIRE_URL=server.url,
        SCIPY_ARRAY_API="1",
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1])]),
    )
    passed, summary = run_as_shipped(
        tmp_path,
        env,
        *("-p", "sklearn_namespace_plugin", "--pyargs", "sklearn.mixture"),
        *("-p", "no:cacheprovider", "-k", "array_api"),
    )
    assert passed >= 32 and "failed" not in summary, summary


# --- SciPy's own array-API tests --------------------------------------------------------------

SCIPY_DIR = Path(scipy.__file__).parent
# A bounded, stable part of SciPy's array-API tests that passes in full: reductions of complex
# values (special's logsumexp), cluster's vector quantization, and the elementwise iterative
# solver (optimize's Chandrupatla), whose loops index by boolean masks and test any() each step.
SCIPY_PARTS = (
    "special/tests/test_logsumexp.py",
    "cluster/tests/test_vq.py::TestVq",
    "optimize/tests/test_chandrupatla.py",
)
SCIPY_SELECTION = "not chandrupatla or test_basic or test_flags or test_maxiter_callback"
SCIPY_ROUND_TRIPS_MOST = 2600  # some 15% over what python -m bench.scipy_suites counts for them


def test_scipys_own_array_api_tests_pass(server: ServerProcess, tmp_path: Path) -> None:
    """SciPy's tests that take ``xp`` (SCIPY_ARRAY_API=1), parametrized over Tensorwire's
    namespace by tests/scipy_namespace_plugin.py, run as SciPy ships them, with the round
    trips they cost counted (bench/_plugins/tensorwire_round_trips.py)."""
    out = tmp_path / "results.json"
    env = dict(
        SCIPY_TEST_NS="client.array_api",
        TENSORWIRE_URL=server.url,
        SCIPY_ARRAY_API="1",
        SCIPY_SUITES_OUT=str(out),
        PYTHONPATH=os.pathsep.join(
            str(p) for p in (Path(__file__).parent, ROOT, ROOT / "bench" / "_plugins")
        ),
    )
    passed, summary = run_as_shipped(
        tmp_path,
        env,
        *("-p", "scipy_namespace_plugin", "-p", "tensorwire_round_trips"),
        *("-p", "no:cacheprovider", "-m", "array_api_backends", "-k", SCIPY_SELECTION),
        *("--rootdir", str(SCIPY_DIR), *(str(SCIPY_DIR / part) for part in SCIPY_PARTS)),
    )
    assert passed >= 415 and "failed" not in summary, summary
    tests = json.loads(out.read_text())["tests"]
    trips = sum(sum(test["trips"].values()) for test in tests.values())
    assert trips <= SCIPY_ROUND_TRIPS_MOST, f"{trips} round trips over {len(tests)} tests"
