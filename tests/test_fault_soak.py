"""``python -m bench.faults`` trains through cutting proxies beside the soak's attackers
(issue 33): a short run here keeps the script working and checks what must hold on any machine,
however loaded: the proxies cut, the server lives, and every client's numbers equal its uncut
twin's with no call failed. The RSS drift and the latencies are the bench's to report, not a
test's to time."""

from __future__ import annotations

import pytest

from bench import faults

pytestmark = pytest.mark.e2e


def test_a_short_fault_soak_keeps_every_client_equal_to_its_twin() -> None:
    figures = faults.faults(8.0, clients=2)
    assert figures["server_alive"] and figures["cuts"] > 0
    assert figures["clients_reported"] == 2
    assert all(c["rounds_compared"] > 0 for c in figures["per_client"])
    assert figures["rounds_differing"] == 0
    assert figures["failed_calls"] == 0, [c["failures"] for c in figures["per_client"]]
    assert figures["twin_failed_calls"] == 0
    assert set(faults.verdict(figures)) == {
        "every client equals its twin, no call failed",
        "RSS drift after warm-up < 5%",
        "the proxies cut",
        "server alive",
    }
