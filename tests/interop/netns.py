"""A private network for interop tests: a namespace with a veth pair and a server inside.

libnice (GStreamer's ICE agent) never gathers on 127.0.0.1, so loopback calls cannot use
it. Each test module gets a fresh namespace holding both ends of a veth pair, one address
for the server and one for the client (IPv4, plus IPv6 ULA so that the server pairs IPv6
too), its own ``lo``, and nothing else: no route out, nothing else listening. Deleting the
namespace removes the links with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import stop_process

ROOT = Path(__file__).resolve().parents[2]
SERVER_ADDRESS = "10.77.0.1"
CLIENT_ADDRESS = "10.77.0.2"
SERVER_ADDRESS6 = "fd77::1"
CLIENT_ADDRESS6 = "fd77::2"
SERVER_PORT = 8080  # the namespace is new and empty: no port can be taken


class NamespaceUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, no permission)."""


@dataclass(frozen=True)
class Namespace:
    name: str

    def command(self, argv: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
        """``argv`` run inside the namespace, with ``env`` set for it."""
        settings = [f"{key}={value}" for key, value in (env or {}).items()]
        return ["ip", "netns", "exec", self.name, "env", *settings, *argv]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=30, check=True
        )

    def get_json(self, url: str) -> Any:
        """GET ``url`` from inside the namespace (the server is not reachable from outside)."""
        script = (
            "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"
        )
        return json.loads(self.run(sys.executable, "-c", script, url).stdout)


def _ip(*argv: str) -> None:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NamespaceUnavailable(f"`ip {' '.join(argv)}` failed: {result.stderr.strip()}")


@contextlib.contextmanager
def network_namespace() -> Iterator[Namespace]:
    if os.geteuid() != 0:
        raise NamespaceUnavailable("network namespaces need root")
    if shutil.which("ip") is None:
        raise NamespaceUnavailable("iproute2's `ip` is missing")
    name = f"cosyrtc-{os.getpid()}-{secrets.token_hex(3)}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", "srv0", "type", "veth", "peer", "name", "cli0")
        for device, v4, v6 in (
            ("srv0", SERVER_ADDRESS, SERVER_ADDRESS6),
            ("cli0", CLIENT_ADDRESS, CLIENT_ADDRESS6),
        ):
            _ip("-n", name, "addr", "add", f"{v4}/24", "dev", device)
            _ip("-n", name, "addr", "add", f"{v6}/64", "dev", device, "nodad")
            _ip("-n", name, "link", "set", device, "up")
        yield Namespace(name)
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)


@dataclass
class NamespacedServer:
    namespace: Namespace
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def session(self, session_id: str) -> dict[str, Any]:
        described: dict[str, Any] = self.namespace.get_json(f"{self.url}/sessions/{session_id}")
        return described


@contextlib.contextmanager
def namespaced_server(namespace: Namespace, *args: str) -> Iterator[NamespacedServer]:
    """``python -m server serve`` inside ``namespace``, ICE on its IPv4 and IPv6 addresses."""
    command = [
        sys.executable, "-m", "server", "serve", "--host", SERVER_ADDRESS,
        "--port", str(SERVER_PORT), "--workers", "1", "--engine", "echo",
        "--ice-host", SERVER_ADDRESS, "--ice-host", SERVER_ADDRESS6, *args,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        log_path = Path(folder) / "server.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                namespace.command(command), cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT
            )
        server = NamespacedServer(
            namespace, f"http://{SERVER_ADDRESS}:{SERVER_PORT}", process, log_path
        )
        try:
            _wait_until_serving(server)
            yield server
        finally:
            stop_process(process, grace=15)


def _wait_until_serving(server: NamespacedServer, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while "cosyrtc is running" not in server.log():
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited: {server.log()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not start: {server.log()[-2000:]}")
        time.sleep(0.2)
