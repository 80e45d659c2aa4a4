"""A real Triton server for the ``cosyvoice-triton`` tests: the stand-in on a free port.

``scripts/triton_standin.py`` runs from its own environment (``make triton-standin`` builds
``.venv/triton``: nvidia-pytriton's CPU tritonserver needs numpy < 2). Each test that uses it
starts it and ends it by its pid (the launcher execs the server in a process group of its
own, whose id is that pid, so its backend stub ends with it); every start gets a fresh model
repository, and all starts of one server append to one events file, which the tests read to
see what the model saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from media.engines.cosyvoice_triton.engine import CosyVoiceTritonEngine
from media.engines.registry import EngineRegistry
from scripts.triton_standin import shm_prefix

ROOT = Path(__file__).resolve().parents[2]
TRITON_PYTHON = ROOT / ".venv" / "triton" / "bin" / "python"
STANDIN = ROOT / "scripts" / "triton_standin.py"
STOP_WAIT_S = 10.0
READY_WAIT_S = 30.0
SHARED_MEMORY = Path("/dev/shm")

needs_triton = pytest.mark.skipif(
    not TRITON_PYTHON.exists(),
    reason=f"no Triton stand-in environment at {TRITON_PYTHON}: `make triton-standin` builds it",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Standin:
    """One stand-in server: started, killed and restarted on the same port."""

    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def events_path(self) -> Path:
        return self.workdir / "events.jsonl"

    def start(self) -> None:
        run = self.workdir / f"run{self.starts}"
        run.mkdir(parents=True)
        self.starts += 1
        with open(run / "server.log", "wb") as log:
            self.process = subprocess.Popen(
                [
                    str(TRITON_PYTHON),
                    str(STANDIN),
                    f"--grpc-port={self.port}",
                    f"--workdir={run}",
                    f"--events={self.events_path}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL to its process group (the group's id is its pid): the server and its
        backend stub vanish mid-stream, as a crashed server does.

        Also how a test ends it: a stand-in keeps nothing worth a graceful exit, which
        takes Triton seconds. The shared memory the server leaves is removed.
        """
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_WAIT_S)
        for region in SHARED_MEMORY.glob(shm_prefix(process.pid) + "*"):
            region.unlink(missing_ok=True)

    def events(self, kind: str | None = None, **match: Any) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text(encoding="utf-8").splitlines()
        found = [json.loads(line) for line in lines if line]
        return [
            event
            for event in found
            if (kind is None or event["event"] == kind)
            and all(event.get(key) == value for key, value in match.items())
        ]


@pytest.fixture
def make_standin(tmp_path: Path) -> Iterator[Callable[[], Standin]]:
    """Start stand-ins for one test; every one still running at its end is stopped."""
    made: list[Standin] = []

    def make() -> Standin:
        standin = Standin(tmp_path / f"standin{len(made)}")
        made.append(standin)
        standin.start()
        return standin

    yield make
    for standin in made:
        standin.kill()


def triton_registry(url: str, **settings: str) -> EngineRegistry:
    """A registry with the engine pointed at ``url``; quick reconnection for tests."""
    values = {"url": url, "reconnect_max": "0.5", "connect_timeout": "2", **settings}
    return EngineRegistry.load(["echo", "cosyvoice-triton"], {"cosyvoice-triton": values})


def triton_engine(registry: EngineRegistry) -> CosyVoiceTritonEngine:
    engine = registry.get("cosyvoice-triton")
    assert isinstance(engine, CosyVoiceTritonEngine)
    return engine


@dataclass
class Served:
    """A running stand-in and a registry whose engine is connected to it."""

    standin: Standin
    registry: EngineRegistry

    @property
    def engine(self) -> CosyVoiceTritonEngine:
        return triton_engine(self.registry)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One stand-in for a module's tests that leave it running."""
    if not TRITON_PYTHON.exists():
        pytest.skip(f"no Triton stand-in environment at {TRITON_PYTHON}: `make triton-standin`")
    standin = Standin(tmp_path_factory.mktemp("triton"))
    standin.start()
    registry = triton_registry(standin.url)
    try:
        engine = triton_engine(registry)
        assert engine.wait_until_available(READY_WAIT_S), engine.unavailable_reason
        yield Served(standin, registry)
    finally:
        registry.close()
        standin.kill()
