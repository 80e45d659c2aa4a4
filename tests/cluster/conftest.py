"""The cluster tests' Redis: one per test (bench/cluster.py starts it and the nodes)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from bench.cluster import REDIS, RedisServer
from bench.common import free_port


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    if REDIS is None or shutil.which("redis-cli") is None:
        pytest.skip("Debian's redis-server is missing: `make test` installs it")
    server = RedisServer(free_port())
    server.start()
    yield server
    server.kill()
