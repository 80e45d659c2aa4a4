"""GStreamer's webrtcbin calls the server: WHIP publishing, a sendrecv call, the WHIP CLI.

webrtcbin is the stack behind GStreamer's ``whipsink`` and Debian's ``simple-whip-client``:
libnice for ICE and an RSA certificate for DTLS. Before the DTLS adaptation in
``media.rtc.compat`` every one of these calls reached ICE "completed" and then failed:
GStreamer logged ``tls_post_process_client_hello: no shared cipher``. libnice also offers
IPv6 link-local candidates with the highest priorities; the server must ignore them.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import TONE_SECONDS
from tests.interop.netns import NamespacedServer
from tests.interop.signals import read_raw, stepped_tone, tone_match

HERE = Path(__file__).resolve().parent
# Five one-second windows of the echoed tone are judged (the median): a window in which the
# server's output cushion stretched time around a late hop (a loaded machine) scores lower,
# and with three windows two such could decide the result.
CALL_SECONDS = 6.0
FRAMES_PER_SECOND = 50
MIN_CORRELATION = 0.9  # Opus at 96 kb/s keeps a tone's waveform: a real echo scores ~0.99
LINK_LOCAL_PAIR = re.compile(r"-> \('fe80:")
CLI_CONNECT_TIMEOUT_S = 20.0


def gst_call(
    python: str, server: NamespacedServer, tone: Path, mode: str, receive: Path | None = None
) -> dict[str, Any]:
    argv = [
        python, str(HERE / "gst_client.py"), "--url", server.url, "--mode", mode,
        "--send", str(tone), "--seconds", str(CALL_SECONDS),
    ]  # fmt: skip
    if receive is not None:
        argv += ["--receive", str(receive)]
    done = subprocess.run(
        server.namespace.command(argv), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report.get("errors"), (report.get("errors"), done.stderr[-2000:])
    return report


def assert_server_heard(described: dict[str, Any], seconds: float) -> None:
    """The server decoded about as many 20 ms frames as the call lasted."""
    frames = described["receive"]["frames"]
    assert frames >= 0.8 * seconds * FRAMES_PER_SECOND, described["receive"]
    assert described["receive"]["concealed"] <= 0.02 * frames


def assert_no_link_local_pairs(server: NamespacedServer) -> None:
    """libnice's fe80:: candidates were offered (see the report) and never paired."""
    assert not LINK_LOCAL_PAIR.search(server.log()), "a pair with an IPv6 link-local address"


def test_gstreamer_whip_publisher_trickles_and_its_audio_reaches_the_server(
    gst_python: str, echo_server: NamespacedServer, tone_raw: Path
) -> None:
    report = gst_call(gst_python, echo_server, tone_raw, "whip")
    assert report["post_status"] == 201
    assert "connected" in report["states"]
    assert any("fe80:" in c for c in report["local_candidates"])
    assert report["patch_statuses"] and set(report["patch_statuses"]) == {204}
    assert_server_heard(report["server"], CALL_SECONDS)
    assert report["server"]["frames_out"] == 0  # a sendonly publisher gets a recvonly answer
    assert report["delete_status"] == 200
    assert_no_link_local_pairs(echo_server)


def test_gstreamer_sendrecv_call_over_offer_hears_its_own_tone_back(
    gst_python: str, echo_server: NamespacedServer, tone_raw: Path, tmp_path: Path
) -> None:
    received_path = tmp_path / "received.raw"
    report = gst_call(gst_python, echo_server, tone_raw, "offer", received_path)
    assert report["post_status"] == 200 and report["received_track"]
    assert any("fe80:" in c for c in report["local_candidates"])
    assert_server_heard(report["server"], CALL_SECONDS)
    received = read_raw(received_path)
    assert len(received) >= 0.8 * CALL_SECONDS * 48_000
    assert tone_match(stepped_tone(TONE_SECONDS), received) >= MIN_CORRELATION
    assert report["delete_status"] == 200
    assert_no_link_local_pairs(echo_server)


def test_simple_whip_client_publishes_through_dtls_to_the_server(
    echo_server: NamespacedServer, igd_stub: Path, tone_raw: Path
) -> None:
    """Debian's CLI publisher, as a new user runs it (with the libsoup clash worked around)."""
    client = Path("/usr/bin/whip-client")
    if not client.exists():
        pytest.skip("Debian's simple-whip-client is missing: `make test` installs it")
    audio = (
        f"filesrc location={tone_raw} ! rawaudioparse format=pcm pcm-format=s16le "
        "sample-rate=48000 num-channels=1 ! identity sync=true ! audioconvert ! audioresample ! "
        "opusenc ! rtpopuspay pt=100 ssrc=1 ! queue ! "
        "application/x-rtp,media=audio,encoding-name=OPUS,payload=100"
    )
    argv = [str(client), "-u", f"{echo_server.url}/whip/echo", "-A", audio, "-o", "-l", "4"]
    command = echo_server.namespace.command(argv, env={"LD_LIBRARY_PATH": str(igd_stub)})
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output: list[str] = []
    try:
        session_id = _await_connected(process, output)
        time.sleep(CALL_SECONDS)
        described = echo_server.session(session_id)
    finally:
        process.send_signal(signal.SIGINT)  # the client DELETEs its resource on the way out
        rest, _ = process.communicate(timeout=15)
        output.append(rest.decode(errors="replace"))
    assert_server_heard(described, CALL_SECONDS)
    log = "".join(output)
    assert "DTLS connected" in log and "DTLS failed" not in log
    assert_no_link_local_pairs(echo_server)


def _await_connected(process: subprocess.Popen[bytes], output: list[str]) -> str:
    """Read the client's log until its peer connection is up; return the session id."""
    assert process.stdout is not None
    deadline = time.monotonic() + CLI_CONNECT_TIMEOUT_S
    session_id = None
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode(errors="replace")
        if not line:
            break
        output.append(line)
        if "Resource URL:" in line:
            session_id = line.rsplit("/", 1)[-1].strip()
        if "PeerConnection connected" in line and session_id:
            return session_id
        if "failed" in line.lower():
            break
    raise AssertionError("simple-whip-client did not connect:\n" + "".join(output)[-3000:])
