from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from contextlib import nullcontext

# SciPy reads this once, on import, and scikit-learn's array_api_dispatch refuses to run without
# it: set before any test module imports either (tests/test_consumers.py).
os.environ["SCIPY_ARRAY_API"] = "1"

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import client  # noqa: E402

from . import alone, tiers  # noqa: E402
from .servers import ServerProcess, run_server  # noqa: E402

# Property tests draw the same examples on every run by default, so that a red CI names the
# change that caused it. To hunt for new failures, draw fresh ones:
#     python -m pytest --hypothesis-profile=explore
settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("repeatable")

# --- tiers (tests/tiers.py) and serial tests (tests/alone.py) ---------------------------------
_audit = tiers.Audit()
_turns = pytest.StashKey[alone.Turns | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_turns] = alone.turns(config)


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.assign(items)
    alone.serial_last(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    turns = item.config.stash[_turns]
    with _audit.watching(item), turns.take(item) if turns else nullcontext():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport() -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _audit.report(report)
    return report


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One real server process per test module, on a free loopback port."""
    with run_server("--device", "ndarray:2") as proc:
        yield proc


@pytest.fixture
def url(server: ServerProcess) -> str:
    return server.url


@pytest.fixture
def dev(url: str) -> Iterator[client.RemoteDevice]:
    with client.RemoteDevice(url) as device:
        yield device


@pytest.fixture
def xp(dev: client.RemoteDevice) -> client.Namespace:
    return client.namespace(dev)
