"""A real Redis and real cluster nodes on distinct loopback addresses, for tests and benchmarks.

Redis is Debian's ``redis-server``, started on a free port with no persistence. Node ``k``
is ``python -m server serve`` on 127.0.0.k with ICE on that address, so placement,
relaying and media all cross real addresses. Whoever starts them ends them.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import ROOT, free_port, pinned, stop_process

REDIS = shutil.which("redis-server")
NODE_START_TIMEOUT_S = 60.0


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS is not None
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
            )
            if probe.stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@dataclass
class Node:
    index: int
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def node_id(self) -> str:
        return f"n{self.index}"

    @property
    def address(self) -> str:
        return f"127.0.0.{self.index}"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            stop_process(self.process, grace=20)


def start_node(
    index: int, redis: RedisServer, folder: Path, *extra: str, core: int | None = None
) -> Node:
    port = free_port()
    address = f"127.0.0.{index}"
    command = [
        sys.executable, "-m", "server", "serve", "--host", address, "--port", str(port),
        "--workers", "1", "--engine", "echo", "--engines", "echo", "--ice-host", address,
        "--redis", redis.url, "--node-id", f"n{index}", "--rate-limit", "0",
        # Every test caller is 127.0.0.1: no per-client cap unless a test sets one (in extra).
        "--max-client-sessions", "0", *extra,
    ]  # fmt: skip
    log_path = folder / f"n{index}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            pinned(command, core), cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT
        )
    return Node(index, port, process, log_path)


def wait_until_serving(nodes: Sequence[Node]) -> None:
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    for node in nodes:
        while True:
            if node.process.poll() is not None:
                raise RuntimeError(f"node {node.node_id} exited: {node.log()[-2000:]}")
            try:
                with urllib.request.urlopen(node.url + "healthz", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {node.node_id} did not start") from None
                time.sleep(0.1)
    time.sleep(1.0)  # every node's first heartbeat is in Redis


@contextlib.contextmanager
def cluster_of(
    redis: RedisServer, capacities: Sequence[int], *extra: str, core: int | None = None
) -> Iterator[list[Node]]:
    """Nodes 127.0.0.2, .3, ... with the given ``--max-sessions`` each (pinned to ``core``)."""
    with tempfile.TemporaryDirectory() as folder:
        nodes = [
            start_node(
                2 + i, redis, Path(folder), "--max-sessions", str(capacity), *extra, core=core
            )
            for i, capacity in enumerate(capacities)
        ]
        try:
            wait_until_serving(nodes)
            yield nodes
        finally:
            for node in nodes:
                node.stop()
