"""Prometheus metrics of one server, exposed at ``GET /metrics``.

No I/O: the transport serves :meth:`Metrics.exposition`. Each :class:`~server.app.Server` owns
its own registry, so several servers in one process never share counts.

Three kinds of numbers. What is counted once per message (bytes received and sent, messages
answered on arrival, read latency) is plain integers, bumped on the event loop and turned into
series when scraped (:class:`_MessageCollector`): a prometheus_client counter takes a lock and
checks its labels on every bump, several times a message. Rarer events (sessions opened,
refusals) are prometheus_client counters. Numbers the sessions already keep (ops run by kind,
op errors by code, tensors and bytes held, messages in flight) are collected when scraped, so
the op loop pays a dict increment and no lock: see :class:`_SessionCollector`.

Series (all prefixed ``tensorwire_``)::

    sessions_open                   gauge    sessions now open
    sessions_opened_total           counter  handshakes that made a session
    ops_total{kind}                 counter  ops executed, by op name (matmul, exp, ...)
    op_errors_total{code}           counter  ops that failed, by error code
    received_bytes_total            counter  websocket message bytes received
    sent_bytes_total                counter  websocket message bytes sent
    tensors_held                    gauge    tensors (and failure marks) stored, all sessions
    tensor_bytes_held               gauge    bytes of stored tensors, all sessions
    messages_in_flight              gauge    messages received whose replies are not yet sent
    answered_on_arrival_total       counter  messages answered in the callback that received
                                             them (server/answering.py), not by a task's turn
    read_seconds                    histogram  from a read's batch arriving to its reply sent
    refusals_total{limit}           counter  connections or work refused, by the limit hit
    draining                        gauge    1 after SIGTERM, while sessions finish
    memory_budget_bytes             gauge    the configured server-wide budget (absent: none)
    spare_bytes                     gauge    freed tensors' memory kept for uploads
    log_records_dropped_total{reason}  counter  log lines not written: over a connection's
                                             rate, the server's, or a kind's (server/logs.py)
    log_records_cut_total           counter  log lines with a field cut to its bound
    build_info{version,protocol}    gauge    1, labelled with the package's version and protocol

and the process's own, with Prometheus' standard names (no prefix; prometheus_client's
``ProcessCollector``, on Linux): ``process_resident_memory_bytes``,
``process_virtual_memory_bytes``, ``process_cpu_seconds_total``, ``process_open_fds``,
``process_max_fds``, ``process_start_time_seconds``.

Neither this module nor ``/metrics`` ever sees tensor data.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from protocol import PROTOCOL_VERSION, ErrorCode, __version__

from . import logs

if TYPE_CHECKING:  # the sessions it reads are handed to it; it never makes one
    from .session import Session

PREFIX = "tensorwire"
READ_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Labels of refusals_total: connections refused or dropped. Ops refused by a limit (size,
# quota, budget) are counted by code in op_errors_total.
REFUSAL_LIMITS = (
    "auth",
    "version",
    "device_index",
    "handshake_timeout",
    "draining",
    "origin",
    "connections",
    "idle",
    "send_timeout",
    "deadline",
    "shutdown",
    "resume",
    "detached",
)
REFUSAL_LIMIT = {  # handshake refusals: the limit label of each error code
    ErrorCode.AUTH_FAILED: "auth",
    ErrorCode.VERSION_MISMATCH: "version",
    ErrorCode.BAD_DEVICE_INDEX: "device_index",
    ErrorCode.SESSION_UNKNOWN: "resume",
    ErrorCode.SESSION_EXPIRED: "resume",
    ErrorCode.SESSION_DROPPED: "resume",
}


class _SessionCollector(Collector):
    """Reads the live sessions' own counts at scrape time, plus those of closed sessions."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        sessions = list(m.sessions())
        ops, errors = Tally(m.retired_ops), Tally(m.retired_errors)
        for session in sessions:
            ops.update(dict(session.op_counts))  # dict() copies atomically; threads may add
            errors.update(dict(session.error_counts))
        yield _counter("ops", "Ops executed successfully, by op name.", "kind", ops)
        yield _counter("op_errors", "Ops that failed, by error code.", "code", errors)
        yield _gauge("sessions_open", "Sessions now open (detached ones included).", len(sessions))
        yield _gauge(
            "sessions_waiting", "Sessions waiting to be resumed (detached).", m.detached_now()
        )
        yield _gauge(
            "tensors_held", "Tensors stored, all sessions.", sum(len(s.store) for s in sessions)
        )
        yield _gauge(
            "tensor_bytes_held",
            "Bytes of stored tensors, all sessions.",
            sum(s.store.nbytes for s in sessions),
        )
        yield _gauge(
            "messages_in_flight",
            "Messages received whose replies are not yet sent.",
            m.in_flight(),
        )
        yield _gauge("draining", "1 while the server drains after SIGTERM.", int(m.draining()))
        yield _gauge("spare_bytes", "Memory of freed tensors kept for uploads.", m.spare_bytes())
        if m.memory_budget is not None:
            yield _gauge(
                "memory_budget_bytes", "Configured server-wide tensor budget.", m.memory_budget
            )


class MessageCounts:
    """What is counted once per message, as plain numbers (see the module docstring). Bumped
    on the event loop only."""

    def __init__(self) -> None:
        self.received_bytes = 0
        self.sent_bytes = 0
        self.answered_on_arrival = 0
        self.read_buckets = [0] * (len(READ_BUCKETS) + 1)  # the last: over every bound
        self.read_sum = 0.0

    def read_done(self, reads: int, seconds: float) -> None:
        """``reads`` read requests were answered ``seconds`` after their batch arrived."""
        if reads:
            self.read_buckets[bisect_left(READ_BUCKETS, seconds)] += reads
            self.read_sum += reads * seconds


class _MessageCollector(Collector):
    """The message counts as Prometheus series, at scrape time."""

    def __init__(self, counts: MessageCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        c = self._counts
        yield _total("received_bytes", "Websocket message bytes received.", c.received_bytes)
        yield _total("sent_bytes", "Websocket message bytes sent.", c.sent_bytes)
        yield _total(
            "answered_on_arrival",
            "Messages answered in the callback that received them, without a task's turn.",
            c.answered_on_arrival,
        )
        cumulative, running = [], 0
        for bound, count in zip(
            [*(str(float(b)) for b in READ_BUCKETS), "+Inf"], c.read_buckets, strict=True
        ):
            running += count
            cumulative.append((bound, running))
        yield HistogramMetricFamily(
            f"{PREFIX}_read_seconds",
            "Seconds from a read's batch arriving to its reply being sent.",
            buckets=cumulative,
            sum_value=c.read_sum,
        )


class _LogCollector(Collector):
    """What this process's log dropped and cut (:data:`server.logs.COUNTS`), at scrape time."""

    def collect(self) -> Iterator[Metric]:
        dropped = Tally({reason: 0 for reason in logs.DROP_REASONS})
        dropped.update(dict(logs.COUNTS.dropped))
        yield _counter(
            "log_records_dropped",
            "Log lines not written: over a connection's rate, the server's, or a kind's.",
            "reason",
            dropped,
        )
        yield _total("log_records_cut", "Log lines with a field cut to its bound.", logs.COUNTS.cut)


def _total(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _counter(name: str, doc: str, label: str, values: Tally[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class Metrics:
    """One server's metrics. The transport bumps :attr:`messages` and calls :meth:`refused` on
    the event loop, and :meth:`retire` when a session closes.

    Args:
        sessions: returns the open sessions (called at scrape time, on the event loop).
        in_flight: returns how many received messages still await their replies.
        draining: returns True once the server drains.
        memory_budget: the configured budget in bytes, or None.
        spare_bytes: returns the bytes of freed tensors kept for uploads.
    """

    def __init__(
        self,
        sessions: Callable[[], Iterable[Session]],
        in_flight: Callable[[], int],
        draining: Callable[[], bool],
        memory_budget: int | None = None,
        spare_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        self.sessions = sessions
        self.spare_bytes = spare_bytes
        self.in_flight = in_flight
        self.draining = draining
        self.memory_budget = memory_budget
        self.retired_ops: Tally[str] = Tally()
        self.retired_errors: Tally[str] = Tally()
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_opened = Counter(
            f"{PREFIX}_sessions_opened", "Handshakes that made a session.", registry=r
        )
        self.sessions_detached = Counter(
            f"{PREFIX}_sessions_detached",
            "Sessions that lost their connection and waited to be resumed.",
            registry=r,
        )
        self.sessions_resumed = Counter(
            f"{PREFIX}_sessions_resumed", "Sessions taken up again on a new connection.", registry=r
        )
        self.detached_now: Callable[[], int] = lambda: 0  # set by the connections
        self.messages = MessageCounts()
        r.register(_MessageCollector(self.messages))
        self.refusals = Counter(
            f"{PREFIX}_refusals", "Connections or work refused, by limit.", ["limit"], registry=r
        )
        for limit in REFUSAL_LIMITS:
            self.refusals.labels(limit)  # every known limit shows up at 0 before it is hit
        r.register(_SessionCollector(self))
        r.register(_LogCollector())
        ProcessCollector(registry=r)  # memory, CPU seconds, open fds, start time (Linux /proc)
        build = Gauge(
            f"{PREFIX}_build_info",
            "1, labelled with the server's package version and protocol version.",
            ["version", "protocol"],
            registry=r,
        )
        build.labels(__version__, str(PROTOCOL_VERSION)).set(1)

    def refused(self, limit: str) -> None:
        """Count one refusal because of ``limit`` (see :data:`REFUSAL_LIMITS`)."""
        self.refusals.labels(limit).inc()

    def retire(self, session: Session) -> None:
        """Keep a closing session's op counts in the totals."""
        self.retired_ops.update(session.op_counts)
        self.retired_errors.update(session.error_counts)

    def exposition(self) -> bytes:
        """The Prometheus text format of every series (content type :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
