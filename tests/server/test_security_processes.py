"""The guards in real ``serve`` processes: HTTPS from a certificate, start-up errors for a bad
one, and a multi-worker front enforcing tokens and the rate limit itself."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bench.common import spawned_server
from media.rtc.compat import restrict_host_addresses
from tests.server.test_cli import (
    LOOPBACK,
    ROOT,
    START_TIMEOUT_S,
    clean_env,
    command,
    free_port,
    run_cli,
)
from tests.signaling.offers import new_offer

TOKEN = "front-token-0123456789"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, LOOPBACK)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def https_status(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture
def https_serve(tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext, Path]]:
    """``serve --tls-cert --tls-key`` (one process, auth on); yields URL, trust, log."""
    cert, key = self_signed(tmp_path)
    port = free_port()
    argv = ["serve", "--port", str(port), "--engine", "echo", "--workers", "1"]
    argv += ["--ice-host", LOOPBACK, "--tls-cert", str(cert), "--tls-key", str(key)]
    env = {**clean_env(), "COSYRTC_AUTH_TOKEN": TOKEN}
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command(*argv),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    trust = ssl.create_default_context(cafile=str(cert))
    url = f"https://{LOOPBACK}:{port}/"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"serve exited with {process.returncode}:\n{log.read_text()}")
            try:
                if https_status(url + "healthz", trust) == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"serve not healthy after {START_TIMEOUT_S:.0f} s:\n{log.read_text()}")
            time.sleep(0.2)
        yield url, trust, log
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_serve_speaks_https_with_the_given_certificate(
    https_serve: tuple[str, ssl.SSLContext, Path],
):
    url, trust, log = https_serve
    assert https_status(url + "healthz", trust) == 200  # verified against the certificate
    assert https_status(url + "engines", trust) == 401
    assert https_status(url + "engines", trust, {"Authorization": f"Bearer {TOKEN}"}) == 200
    assert f"open {url}" in log.read_text()
    with pytest.raises(urllib.error.URLError):  # a client that does not trust it refuses it
        https_status(url + "healthz", ssl.create_default_context())
    assert TOKEN not in log.read_text()


@pytest.mark.parametrize("problem", ["missing", "not-pem", "wrong-key"])
def test_a_certificate_that_cannot_be_loaded_stops_start_up_with_exit_2(
    tmp_path: Path, problem: str
):
    cert, key = self_signed(tmp_path)
    if problem == "missing":
        cert = tmp_path / "nowhere.pem"
    elif problem == "not-pem":
        cert.write_text("not a certificate\n")
    else:
        other = tmp_path / "other"
        other.mkdir()
        _, key = self_signed(other)  # a key that is not the certificate's
    argv = ["serve", "--port", str(free_port()), "--tls-cert", str(cert), "--tls-key", str(key)]
    done = run_cli(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --tls-cert")
    assert "Traceback" not in done.stderr


def children(pid: int) -> list[list[str]]:
    """The command lines of ``pid``'s child processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append([part.decode() for part in cmdline.split(b"\0") if part])
    return found


@pytest.fixture
def guarded_front() -> Iterator[tuple[str, int]]:
    """``serve --workers 2`` with a token and two new sessions a minute per address."""
    port = free_port()
    argv = [sys.executable, "-m", "server", "serve", "--port", str(port), "--workers", "2"]
    argv += ["--engine", "echo", "--ice-host", LOOPBACK, "--rate-limit", "2"]
    argv += ["--auth-token", TOKEN, "--spare-workers", "0"]
    with spawned_server(argv, port, core=None, ready_path="healthz", ready_timeout=120) as s:
        yield s.url, s.pid


async def test_front_checks_tokens_limits_offers_and_passes_the_token_on(
    guarded_front: tuple[str, int],
):
    """Workers check the same token, so each answer past the front shows it was forwarded;
    workers get ``--rate-limit 0``, as every request they see comes from the front."""
    url, pid = guarded_front
    restrict_host_addresses([LOOPBACK])  # this process's offers: loopback candidates only
    auth = {"Authorization": f"Bearer {TOKEN}"}
    processes = children(pid)
    workers = [argv for argv in processes if "worker" in argv]
    assert len(workers) == 2
    assert len(processes) == 4  # and the model host and its spare, which serve no HTTP
    for argv in workers:
        last = len(argv) - 1 - argv[::-1].index("--rate-limit")
        assert argv[last + 1] == "0"  # the front limits, for all of them
    socket_path = next(
        argv[i + 1] for argv in workers for i, a in enumerate(argv) if a == "--socket"
    )
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(socket_path)) as worker:
        async with worker.get("http://worker/internal/load") as response:
            assert response.status == 401  # so the front's own load reading must send it
        async with worker.get("http://worker/internal/load", headers=auth) as response:
            assert response.status == 200

    async with aiohttp.ClientSession() as http:
        async with http.get(url + "engines") as response:
            assert response.status == 401
        async with http.get(url + "engines", headers={"Authorization": "Bearer guess"}) as response:
            assert response.status == 403
        async with http.get(url + "engines", headers=auth) as response:
            assert response.status == 200
        preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
        async with http.options(url + "offer", headers=preflight) as response:
            assert response.status == 204
            assert response.headers["Access-Control-Allow-Origin"] == "*"

        sessions = []
        for _ in range(2):
            offer = {"sdp": await new_offer(), "type": "offer"}
            async with http.post(url + "offer", json=offer, headers=auth) as response:
                assert response.status == 200, await response.text()
                sessions.append((await response.json())["session_id"])
        offer = {"sdp": await new_offer(), "type": "offer"}
        async with http.post(url + "offer", json=offer, headers=auth) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 1
            assert (await response.json())["error"] == "rate_limited"

        for session_id in sessions:
            async with http.get(f"{url}sessions/{session_id}") as response:
                assert response.status == 401
            async with http.get(f"{url}sessions/{session_id}", headers=auth) as response:
                assert response.status == 200
            async with http.delete(f"{url}sessions/{session_id}", headers=auth) as response:
                assert response.status == 200
