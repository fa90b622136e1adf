"""``python -m bench.soak`` runs its attackers beside well-behaved sessions (issue 17): a short
soak here keeps the script working and checks what must hold on any machine, however loaded:
the server lives and every well-behaved result is right. The latency and memory goals are the
bench's to report (bench/HISTORY.md, run 43), not a test's to time."""

from __future__ import annotations

import pytest

from bench import soak

pytestmark = pytest.mark.e2e


def test_a_short_soak_keeps_the_server_alive_and_every_result_right() -> None:
    figures = soak.soak(8.0, sessions=2)
    assert figures["server_alive"]
    assert figures["well_behaved_reads"] > 0 and figures["connects"] > 0
    assert figures["wrong_results"] == 0 and figures["failed_calls"] == []
    assert set(soak.verdict(figures)) == {
        "p99 read < 100 ms",
        "new connection < 1 s",
        "RSS < 1.5x budget + at rest",
        "every result correct",
        "server alive",
    }
