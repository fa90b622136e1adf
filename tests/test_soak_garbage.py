"""The soak's attackers leave nothing to the garbage collector: the server frees what an
ended session held by reference counting alone (ARCHITECTURE.md, 'The server's memory goes by
reference counting'), so no path an attacker takes may leave a server object in a reference
cycle. The attackers run as the soak runs them, each a process of its own, against the real
serving code in this process, whose collector is off meanwhile."""

from __future__ import annotations

import gc
import multiprocessing
import time

import pytest
from anyio.from_thread import start_blocking_portal

from bench.attacks import ATTACKS, attack_until
from server import Server, ServerConfig

from .polling import wait_until

pytestmark = pytest.mark.e2e

SECONDS = 4.0  # of attacks: each attacker's kind of work is done several times over


def test_no_attack_leaves_a_server_object_to_the_garbage_collector() -> None:
    config = ServerConfig(
        port=0,
        memory_budget="256MiB",
        session_quota="64MiB",
        max_connections=64,
        peers=("ws://127.0.0.1:*",),
        allow_any_peer_port=True,
        resume_window=0,  # an attacker killed at the end ends its session at once
    )
    srv = Server(config)
    with start_blocking_portal(backend="asyncio") as portal:
        future, _ = portal.start_task(srv.serve)
        url = f"ws://127.0.0.1:{srv.port}"
        gc.collect()
        gc.disable()  # what only a collection would free stays, to be found below
        try:
            deadline = time.time() + SECONDS
            spawn = multiprocessing.get_context("spawn")
            attackers = [
                spawn.Process(target=attack_until, args=(name, url, deadline), daemon=True)
                for name in ATTACKS
            ]
            for attacker in attackers:
                attacker.start()
            for attacker in attackers:
                attacker.join(timeout=max(0.0, deadline + 5 - time.time()))
                if attacker.is_alive():
                    attacker.kill()
                    attacker.join()
            wait_until(lambda: not srv.sessions, "every attacker's session to end")
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            kept = sorted(
                {
                    f"{type(o).__module__}.{type(o).__qualname__}"
                    for o in gc.garbage
                    if type(o).__module__.startswith(("server.", "protocol."))
                }
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            future.cancel()
    assert not kept, kept
