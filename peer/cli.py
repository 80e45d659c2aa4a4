"""The headless peer: call a server with a WAV file, record the reply, measure the call.

    python -m server peer --url http://127.0.0.1:8080/ --input in.wav --output out.wav --json

Round-trip time is measured in-band (see :mod:`peer.probe`): with chirp markers for
engines that return the waveform (``echo``), by matching speech envelopes otherwise.
``--interrupt-after S`` sends ``interrupt`` S seconds into the call and measures, on what
this peer plays out, how long until the speech went silent and whether any came after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from media.audio.frames import RTC_RATE
from media.audio.wav import read_wav, write_wav
from media.rtc.compat import accept_rsa_dtls_peers, restrict_host_addresses
from peer.call import CONNECT_TIMEOUT_S, PeerCall
from peer.packet_tap import PacketTap
from peer.probe import (
    ChirpInserter,
    marker_rtts,
    rtt_from_envelopes,
    silence_after,
    summarize,
)
from peer.socket_call import SocketCall
from signaling.client import SignalingError

log = logging.getLogger(__name__)

PEER_DESCRIPTION = "Call a cosyrtc server with a WAV file, record the reply, report the call."

WAVEFORM_PRESERVING = ("echo",)
TOKEN_VARIABLE = "COSYRTC_AUTH_TOKEN"  # the server's own variable: one secret for both
SILENCE_LEVEL = 1e-4  # peak below this: nothing audible came back


@dataclass(frozen=True)
class PeerOptions:
    url: str
    input: Path
    output: Path
    engine: str | None = None
    whip: bool = False
    say: str | None = None
    ice_hosts: tuple[str, ...] = ()
    json: bool = False
    rtt: str = "auto"
    tail: float = 1.0
    options: dict[str, Any] | None = None
    codec: dict[str, Any] | None = None
    token: str | None = None
    interrupt_after: float | None = None
    ws: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PeerOptions:
        return cls(
            url=args.url if args.url.endswith("/") else args.url + "/",
            input=Path(args.input),
            output=Path(args.output),
            engine=args.engine,
            whip=args.whip,
            say=args.say,
            ice_hosts=tuple(args.ice_host or ()),
            json=args.json,
            rtt=args.rtt,
            tail=args.tail,
            options=json.loads(args.options) if args.options else None,
            codec={"application": args.opus_application} if args.opus_application else None,
            token=args.token or os.environ.get(TOKEN_VARIABLE) or None,
            interrupt_after=args.interrupt_after,
            ws=args.ws,
        )

    @property
    def rtt_method(self) -> str:
        if self.rtt != "auto":
            return self.rtt
        return "chirp" if self.engine in WAVEFORM_PRESERVING else "envelope"


@dataclass
class PeerReport:
    ok: bool
    error: str | None
    session_id: str | None
    connect_ms: float | None
    frames_sent: int
    frames_received: int
    gaps: int
    concealed: int
    late_dropped: int
    rtt_method: str
    rtt_ms_p50: float | None
    rtt_ms_p95: float | None
    rtt_samples: int
    expanded_ms: float = 0.0  # audio this peer's playout made up while packets were late
    # --interrupt-after: from sending `interrupt` to silence in what this peer played, and
    # how much audible audio came after the first silent frame (should be none).
    interrupt_to_silence_ms: float | None = None
    audible_after_silence_ms: float | None = None
    # ...and on the wire: from sending `interrupt` to the arrival of the last packet with
    # sound (over loopback, when the server sent it), and packets with sound after the
    # first silent one.
    interrupt_last_speech_packet_ms: float | None = None
    interrupt_packets_after_silence: int | None = None


@dataclass
class CallResult:
    """The report plus the audio on both sides, for tests and benchmarks."""

    report: PeerReport
    sent: np.ndarray
    received: np.ndarray


def add_peer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--engine", help="engine to ask for (default: the server's)")
    parser.add_argument("--whip", action="store_true", help="signal with WHIP instead of /offer")
    parser.add_argument(
        "--ws", action="store_true", help="call over the WebSocket transport (/ws), not WebRTC"
    )
    parser.add_argument("--input", required=True, help="WAV file to stream (any rate, mono/stereo)")
    parser.add_argument("--output", required=True, help="where to write the reply (48 kHz WAV)")
    parser.add_argument("--say", help="text to send as a speak message once connected")
    parser.add_argument("--ice-host", action="append", help="gather host candidates only here")
    parser.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    parser.add_argument(
        "--token", help=f"bearer token for a server with auth on [env {TOKEN_VARIABLE}]"
    )
    parser.add_argument(
        "--rtt",
        choices=("auto", "chirp", "envelope"),
        default="auto",
        help="RTT method (auto: chirp for echo, envelope otherwise)",
    )
    parser.add_argument("--tail", type=float, default=1.0, help="seconds to record after input")
    parser.add_argument("--options", help="engine options as a JSON object")
    parser.add_argument(
        "--interrupt-after",
        type=float,
        metavar="S",
        help="send an interrupt S seconds into the call; report interrupt-to-silence as heard",
    )
    parser.add_argument(
        "--opus-application",
        choices=("voip", "audio", "restricted_lowdelay"),
        help="ask the server to encode with this Opus application",
    )


async def call(opts: PeerOptions) -> CallResult:
    """Make one call and measure it; never raises for a failed call, the report says why."""
    accept_rsa_dtls_peers()
    restrict_host_addresses(opts.ice_hosts)
    audio = read_wav(opts.input, RTC_RATE)
    markers = ChirpInserter() if opts.rtt_method == "chirp" else None
    shape = markers.process if markers else None
    peer: PeerCall | SocketCall
    if opts.ws:
        peer = SocketCall(
            opts.url, audio, engine=opts.engine, options=opts.options, shape=shape, token=opts.token
        )
    else:
        peer = PeerCall(
            opts.url,
            audio,
            engine=opts.engine,
            options=opts.options,
            codec=opts.codec,
            whip=opts.whip,
            shape=shape,
            token=opts.token,
        )
    error: str | None = None
    interrupted: list[float] = []

    async def interrupt_later(delay: float) -> None:
        await asyncio.sleep(delay)
        interrupted.append(await peer.send({"type": "interrupt"}))

    tap = PacketTap(peer.receive) if opts.interrupt_after is not None else None
    try:
        async with peer:
            if opts.say:
                await peer.send({"type": "speak", "text": opts.say})
            interrupter = None
            if opts.interrupt_after is not None:
                interrupter = asyncio.create_task(interrupt_later(opts.interrupt_after))
            await peer.source.finished.wait()
            await asyncio.sleep(opts.tail)
            if interrupter is not None:
                interrupter.cancel()
            await peer.end()
    except SignalingError as exc:
        error = str(exc)
    except TimeoutError:
        error = f"the call did not connect within {CONNECT_TIMEOUT_S:.0f} s"
    except aiohttp.ClientError as exc:
        error = f"could not reach {opts.url}: {exc}"

    received, sent = peer.received(), peer.sent()
    write_wav(opts.output, received, RTC_RATE)
    if error is None and (peer.recorder.frames == 0 or float(abs(received).max()) < SILENCE_LEVEL):
        error = "no audio came back"
    if markers is not None:
        rtts = marker_rtts(markers, peer.source.timeline, received, peer.recorder.timeline)
    elif peer.recorder.frames and len(sent):
        rtts = rtt_from_envelopes(sent, peer.source.timeline, received, peer.recorder.timeline)
    else:
        rtts = []
    summary = summarize(rtts)
    stats = peer.receive.stats
    heard = (
        silence_after(received, peer.recorder.timeline, interrupted[0])
        if interrupted and peer.recorder.frames
        else None
    )
    wire: tuple[float | None, int | None] = (None, None)
    if interrupted and tap is not None:
        wire = tap.last_speech_after(interrupted[0]), tap.audible_after_silence(interrupted[0])
    report = PeerReport(
        ok=error is None,
        error=error,
        session_id=peer.session_id,
        connect_ms=round(peer.connect_ms, 1) if peer.connect_ms is not None else None,
        frames_sent=peer.source.frames_sent,
        frames_received=peer.recorder.frames,
        gaps=stats.concealed + stats.skipped,
        concealed=stats.concealed,
        late_dropped=stats.late_dropped,
        rtt_method=opts.rtt_method,
        rtt_ms_p50=summary["rtt_ms_p50"],
        rtt_ms_p95=summary["rtt_ms_p95"],
        rtt_samples=int(summary["rtt_samples"] or 0),
        expanded_ms=stats.expanded_ms,
        interrupt_to_silence_ms=heard.to_silence_ms if heard else None,
        audible_after_silence_ms=heard.audible_after_ms if heard else None,
        interrupt_last_speech_packet_ms=wire[0],
        interrupt_packets_after_silence=wire[1],
    )
    return CallResult(report, sent, received)


async def run_peer(opts: PeerOptions) -> int:
    report = (await call(opts)).report
    if opts.json:
        print(json.dumps(asdict(report)))
    else:
        for key, value in asdict(report).items():
            print(f"{key:16} {value}")
    if not report.ok:
        print(f"error: {report.error}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server peer", description=PEER_DESCRIPTION)
    add_peer_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m server peer ...``."""
    args = build_parser().parse_args(argv)
    return asyncio.run(run_peer(PeerOptions.from_args(args)))
