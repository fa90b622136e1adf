"""The consumer workload: one scikit-learn fit with ``array_api_dispatch=True`` on
Tensorwire arrays and the same fit on numpy arrays, interleaved, and the remote fit's count of
blocking round trips.

The estimator is ``CalibratedClassifierCV`` around ``LinearDiscriminantAnalysis``, with
``method="temperature"``: the one calibration that scikit-learn runs through the array API
(the default, ``"sigmoid"``, calls numpy on the predictions, which a remote array refuses).

Round trips are counted where every request that waits passes, the device's connection
(``client._connection.Connection``): ``request`` sends one (a read, describe, sync or stats)
and ``wait`` blocks until a reply has come. Requests sent back to back before the caller waits
are one round trip: a describe of several ids pipelines its requests and counts once, under its
first request's kind. Nothing in ``client`` changes; both methods are patched on the one
connection for the duration of the fit and restored after. Single-threaded callers only (the
estimator runs with ``n_jobs=None``).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import numpy as np

import client

from ._report import Figure, Stat

Tick = Callable[[], None]
FEATURES = 20
CLASSES = 3


@dataclass
class Tally:
    """The blocking round trips of one counted stretch of a session."""

    requests: Counter[str] = field(default_factory=Counter)  # by kind: Read, Describe, ...
    trips: Counter[str] = field(default_factory=Counter)  # by the kind of their first request
    waited: float = 0.0  # seconds the caller spent blocked in Connection.wait
    _between: bool = field(default=True, repr=False)  # no request since the last wait

    @property
    def round_trips(self) -> int:
        return sum(self.trips.values())


@contextmanager
def counting(dev: client.Device) -> Iterator[Tally]:
    """Count the blocking round trips of ``dev``'s session until the block ends. The time in
    ``wait`` includes the server running the ops queued before each request, as the caller
    experiences it."""
    conn = dev._conn
    tally = Tally()
    request, wait = conn.request, conn.wait

    def counted_request(make: Callable[[int], Any]) -> Any:
        def named(request_id: int) -> Any:
            message = make(request_id)
            kind = type(message).__name__
            tally.requests[kind] += 1
            if tally._between:
                tally.trips[kind] += 1
                tally._between = False
            return message

        return request(named)

    def counted_wait(reply: Any) -> None:
        start = time.perf_counter()
        try:
            wait(reply)
        finally:
            tally.waited += time.perf_counter() - start
            tally._between = True

    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(conn, "request", counted_request))
        patches.enter_context(mock.patch.object(conn, "wait", counted_wait))
        yield tally


def _sklearn() -> Any:
    """scikit-learn, imported with SciPy's array-API support on. SciPy reads
    ``SCIPY_ARRAY_API`` once, on import, and scikit-learn's dispatch refuses to run without it.

    Raises:
        RuntimeError: SciPy was imported earlier without ``SCIPY_ARRAY_API=1``.
    """
    if "scipy" in sys.modules and os.environ.get("SCIPY_ARRAY_API") != "1":
        raise RuntimeError("SciPy was imported before SCIPY_ARRAY_API=1 was set")
    os.environ["SCIPY_ARRAY_API"] = "1"
    import sklearn  # type: ignore[import-untyped]
    import sklearn.calibration  # type: ignore[import-untyped]
    import sklearn.datasets  # type: ignore[import-untyped]
    import sklearn.discriminant_analysis  # type: ignore[import-untyped]

    return sklearn


def _estimator(sklearn: Any) -> Any:
    lda = sklearn.discriminant_analysis.LinearDiscriminantAnalysis()
    return sklearn.calibration.CalibratedClassifierCV(lda, method="temperature")


def _round(
    sklearn: Any, dev: client.RemoteDevice, remote: tuple[Any, Any], local: tuple[Any, Any]
) -> tuple[float, float, Tally, Any, Any]:
    """One remote fit (then a sync, timed but not counted) and one local fit: their seconds,
    the remote fit's tally, and both fitted estimators."""
    start = time.perf_counter()
    with counting(dev) as tally:
        ours = _estimator(sklearn).fit(*remote)
    dev.sync()
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    theirs = _estimator(sklearn).fit(*local)
    return ours_s, time.perf_counter() - start, tally, ours, theirs


def fit(dev: client.RemoteDevice, n: int, reps: int, tick: Tick) -> list[Figure]:
    """Remote fit time over local numpy's, the remote fit's blocking round trips, and the share
    of its time spent waiting on them; ``reps`` interleaved rounds (odd, so that the median is
    one fit's count) after one round to warm up, which also checks that both fits agree."""
    sklearn = _sklearn()
    x, y = sklearn.datasets.make_classification(
        n_samples=n,
        n_features=FEATURES,
        n_informative=FEATURES // 2,
        n_classes=CLASSES,
        random_state=0,
    )
    xp = client.namespace(dev)
    remote = (xp.asarray(x), xp.asarray(y))
    dev.sync()  # the data lives on the device before the first fit, as a consumer's would
    rounds: list[tuple[float, float, Tally]] = []
    with sklearn.config_context(array_api_dispatch=True):
        *_, ours, theirs = _round(sklearn, dev, remote, (x, y))
        sample = slice(0, min(n, 50))
        np.testing.assert_allclose(
            ours.predict_proba(remote[0][sample]).numpy(),
            theirs.predict_proba(x[sample]),
            rtol=1e-6,
            atol=1e-9,
        )
        for _ in range(reps):
            rounds.append(_round(sklearn, dev, remote, (x, y))[:3])
            tick()
    return _figures(f"CalibratedClassifierCV(LDA) fit, {n}x{FEATURES}, array_api_dispatch", rounds)


def _figures(name: str, rounds: list[tuple[float, float, Tally]]) -> list[Figure]:
    remote = Stat.of([ours for ours, _, _ in rounds], "s")
    local = Stat.of([theirs for _, theirs, _ in rounds], "s")
    tallies = [tally for _, _, tally in rounds]
    waited = Stat.of([t.waited for t in tallies], "s")
    count = Stat.of([float(t.round_trips) for t in tallies], "round trips")
    sent = Stat.of([float(t.requests.total()) for t in tallies], "requests")
    last = tallies[-1]
    kinds = ", ".join(_kind(k, last) for k, _ in last.requests.most_common())
    return [
        Figure(
            name,
            "remote time / local numpy",
            remote.median / local.median,
            None,
            remote,
            local,
            "local numpy",
        ),
        Figure(
            name,
            "blocking round trips per fit",
            count.median,
            None,
            count,
            sent,
            f"requests (last fit: {kinds})",
        ),
        Figure(
            name,
            "time waiting on them / remote fit time",
            waited.median / remote.median,
            None,
            waited,
            remote,
            "remote fit",
        ),
    ]


def _kind(kind: str, tally: Tally) -> str:
    """``143 reads`` or, where requests were pipelined, ``89 describes in 84 round trips``."""
    sent, trips = tally.requests[kind], tally.trips[kind]
    return f"{sent} {kind.lower()}s" + ("" if trips == sent else f" in {trips} round trips")
