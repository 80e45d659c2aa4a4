"""Echo calls through an impairing UDP relay: ours against stock aiortc, per network profile.

    .venv/bin/python -m bench.netimpair [--seconds 15] [--profiles clean wifi_spikes ...]
        [--servers ours stock] [--speech-calls 3] [--interrupts 20]

Every datagram between the headless peer and the server crosses the project's relay
(``tests.netfaults.relay.UdpRelay``, impairing both directions once the call is up). The
server runs as its own process pinned to core 0 (ours: ``python -m server serve --engine
echo``; stock: ``bench/stock_server.py``, aiortc's own audio path); the relay and the peer
share this process, pinned to core 1. Per profile and server, a tone call and speech calls:

- a continuous tone with chirp markers (``peer.probe``): silent holes (runs of 20 ms or more
  40 dB below the tone), the silent share of the call, RTT p50/p95 from the markers, and
  how the delay follows the network: after each delay spike, how long until each leg's
  playout delay (ours: the peer's and the server's receive paths) is back within 10 ms of
  where it was before;
- speech (espeak sentences), ``--speech-calls`` calls: PESQ-WB (``pesq``, 16 kHz) of what
  came back against what was sent, aligned on the whole; the median is reported, with every
  call's score. One call's score is no measurement: with the same relay seed, calls of
  the same code through 2 % loss + 30 ms jitter scored from 2.9 to 3.9, as the losses
  fall on speech or on its pauses. Each call also records what each leg's receive path
  did to the audio (ours: the server's and the peer's counts of concealed packets, FEC
  recoveries, late packets, and milliseconds expanded, accelerated and grown): PESQ-WB
  (P.862.2) scores a 20 ms time shift inside an utterance, one late packet's expansion,
  about as harshly as a lost packet, so a call's score follows these counts.

``--interrupts N`` then opens N Piper calls on our server with ``python -m server peer
--say ... --interrupt-after S --json`` and reports interrupt-to-silence as the peer heard it.
Results: a table, ``bench/results/netimpair.json`` and ``bench/results/netimpair.png``
(delay over time on the spiky profile, spikes shaded).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import soxr
from pesq import pesq

from bench.common import (
    RESULTS,
    ROOT,
    free_port,
    percentile,
    pinned,
    print_table,
    server_process,
    spawned_server,
    write_results,
)
from media.audio.frames import RTC_RATE
from media.audio.wav import write_wav
from media.rtc.compat import accept_rsa_dtls_peers, restrict_host_addresses
from peer.call import PeerCall
from peer.probe import ChirpInserter, align, holes, marker_rtts, summarize
from peer.speech import speech_with_pauses
from tests.netfaults.relay import Impairment, UdpRelay

TONE_HZ = 441.7
TONE_LEVEL = 0.3
MARKER_INTERVAL_S = 0.75  # longer than any RTT here, stock aiortc's through spikes included
SETTLE_S = 1.0  # after the impairment starts, before anything is judged
TAIL_S = 1.0
SAMPLE_EVERY_S = 0.05  # the playout delays, for the plot and the shed times
SHED_WITHIN_MS = 10.0  # a spike's delay is shed once a leg is back within this of before
PESQ_RATE = 16_000
# What a receive path did to the audio of a call (``ReceiveStats`` fields), per leg.
LEG_COUNTS = (
    "concealed",
    "recovered_fec",
    "late_dropped",
    "expanded_ms",
    "accelerated_ms",
    "preemptive_ms",
)

PROFILES: dict[str, Impairment] = {
    "clean": Impairment(),
    "loss2": Impairment(loss=0.02),
    "jitter30": Impairment(jitter_ms=30.0),
    "loss2_jitter30": Impairment(loss=0.02, jitter_ms=30.0),
    "loss5_jitter50": Impairment(loss=0.05, jitter_ms=50.0),
    "burst_loss": Impairment(burst_loss=0.01, burst_packets=(3, 6)),
    "wifi_spikes": Impairment(spike_every_s=4.0, spike_ms=(100.0, 300.0)),
    "loss2_jitter30_spikes": Impairment(
        loss=0.02, jitter_ms=30.0, spike_every_s=4.0, spike_ms=(100.0, 300.0)
    ),
    "loss5_jitter50_spikes300": Impairment(
        loss=0.05, jitter_ms=50.0, spike_every_s=4.0, spike_ms=(300.0, 300.0)
    ),
    # A radio that stalls both legs at once for a bit over 100 ms every few seconds (a scan,
    # a retrain), alone and under loss and a jitter that reorders packets 20 ms apart.
    "stalls_both_ways": Impairment(
        spike_every_s=3.0, spike_ms=(110.0, 170.0), spikes_both_ways=True
    ),
    "loss2_jitter30_stalls": Impairment(
        loss=0.02,
        jitter_ms=30.0,
        spike_every_s=3.0,
        spike_ms=(110.0, 170.0),
        spikes_both_ways=True,
    ),
}
PLOT_PROFILE = "wifi_spikes"
PARAGRAPH = (
    "This is a long paragraph that keeps the speaker busy for a good while. "
    "It talks about the river, the mountains and the small town beside the lake. "
    "Every morning the baker opens the shop and the smell of bread fills the street."
)


@dataclass
class Trace:
    """Playout delays over the call (monotonic seconds, ms), for the plot and shed times."""

    client: list[tuple[float, float]] = field(default_factory=list)
    server: list[tuple[float, float]] = field(default_factory=list)


def tone(seconds: float) -> np.ndarray:
    t = np.arange(round(seconds * RTC_RATE)) / RTC_RATE
    return (TONE_LEVEL * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def speech(seconds: float) -> np.ndarray:
    clip = speech_with_pauses().clean
    return np.tile(clip, int(np.ceil(seconds * RTC_RATE / len(clip))))[: round(seconds * RTC_RATE)]


async def sample_delays(
    peer: PeerCall, http: aiohttp.ClientSession, session_url: str | None, trace: Trace
) -> None:
    """Every SAMPLE_EVERY_S: the peer's playout delay, and the server's (ours only)."""
    polled = 0.0
    while True:
        now = time.monotonic()
        trace.client.append((now, peer.receive.stats.delay_ms))
        if session_url is not None and now - polled >= 4 * SAMPLE_EVERY_S:
            polled = now
            received = await server_receive(http, session_url)
            if received is not None and "delay_ms" in received:
                trace.server.append((time.monotonic(), float(received["delay_ms"])))
        await asyncio.sleep(SAMPLE_EVERY_S)


async def server_receive(http: aiohttp.ClientSession, session_url: str) -> dict | None:
    """Our server's receive stats of the session (``GET /sessions/{id}``), None if unread."""
    try:
        async with http.get(session_url) as response:
            body = await response.json()
        received = body["receive"]
    except (aiohttp.ClientError, KeyError, TypeError, ValueError):
        return None
    return received if isinstance(received, dict) else None


def leg_counts(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if stats is None else {key: stats.get(key) for key in LEG_COUNTS}


async def relayed_call(
    url: str, audio: np.ndarray, profile: str, ours: bool, markers: ChirpInserter | None
) -> dict[str, Any]:
    """One echo call through the relay; the audio both ways, stats and the delay traces."""
    trace = Trace()
    with UdpRelay(seed=sum(map(ord, profile))) as relay:
        peer = PeerCall(
            url,
            audio,
            engine="echo" if ours else None,
            shape=markers.process if markers else None,
            offer_filter=relay.rewrite_offer,
            answer_filter=relay.rewrite_answer,
        )
        async with peer, aiohttp.ClientSession() as http:
            session_url = f"{url}sessions/{peer.session_id}" if ours else None
            impaired_at = time.monotonic()
            impaired_from = len(peer.recorder.timeline)
            relay.impair(PROFILES[profile])
            sampler = asyncio.create_task(sample_delays(peer, http, session_url, trace))
            await peer.source.finished.wait()
            input_end = len(peer.recorder.timeline)
            await asyncio.sleep(TAIL_S)
            sampler.cancel()
            server_leg = await server_receive(http, session_url) if session_url else None
            await peer.end()
        spikes = {"up": relay.to_server.spikes, "down": relay.to_client.spikes}
        stats = {"up": vars(relay.to_server.stats), "down": vars(relay.to_client.stats)}
    return {
        "peer": peer,
        "trace": trace,
        "impaired_at": impaired_at,
        "impaired_from": impaired_from,
        "input_end": input_end,
        "spikes": spikes,
        "link_stats": stats,
        "legs": {"server": leg_counts(server_leg), "client": leg_counts(vars(peer.receive.stats))},
    }


def shed_times(
    samples: list[tuple[float, float]], spikes: list[tuple[float, float]]
) -> list[float | None]:
    """Per spike: seconds from its release until the delay is back near its level before.

    Only the time up to the next spike counts (spikes come 2-6 s apart): looking past it, a
    delay shed in 1.2 s read as 3.6-3.9 s, the next spike's peak taken for this one's (six
    of 81 spikes in ``bench.playout_sim``'s calls through ``loss2_jitter30_spikes``). None:
    no delay trace around the spike, or not back before the next one or within 4 s.
    """
    if not samples:
        return []
    times = np.array([t for t, _ in samples])
    delays = np.array([d for _, d in samples])
    shed: list[float | None] = []
    for index, (start, release) in enumerate(spikes):
        until = release + 4.0
        if index + 1 < len(spikes):
            until = min(until, spikes[index + 1][0])
        before = delays[(times >= start - 1.0) & (times < start)]
        after = (times >= release) & (times <= until)
        if not len(before) or not after.any():
            shed.append(None)
            continue
        level = float(np.median(before))
        window_t, window_d = times[after], delays[after]
        peak = int(np.argmax(window_d))
        back = np.flatnonzero(window_d[peak:] <= level + SHED_WITHIN_MS)
        shed.append(round(float(window_t[peak + back[0]] - release), 2) if len(back) else None)
    return shed


def tone_row(result: dict[str, Any], markers: ChirpInserter) -> dict[str, Any]:
    peer: PeerCall = result["peer"]
    start = result["impaired_from"] + int(SETTLE_S * RTC_RATE)
    found = holes(peer.received()[start : result["input_end"]], level=TONE_LEVEL / np.sqrt(2))
    rtts = marker_rtts(markers, peer.source.timeline, peer.received(), peer.recorder.timeline)
    judged = [
        rtt
        for rtt, sent in zip(rtts, _marker_sent_times(markers, peer), strict=False)
        if sent >= result["impaired_at"] + SETTLE_S
    ]
    rtt = summarize(judged or rtts)
    client_shed = shed_times(result["trace"].client, result["spikes"]["down"])
    server_shed = shed_times(result["trace"].server, result["spikes"]["up"])
    shed = [s for s in client_shed + server_shed if s is not None]
    stalls = sorted(set(result["spikes"]["up"]) | set(result["spikes"]["down"]))
    by_stall = holes_by_stall(
        peer.received()[: result["input_end"]], peer.recorder.timeline.index_at, stalls
    )
    return {
        "holes": len(found.lengths_ms),
        "holes_by_stall": by_stall,
        "late_stall_holes": sum(by_stall[2:]),
        "longest_hole_ms": found.longest_ms,
        "silent_pct": round(100 * found.silent_share, 2),
        "rtt_ms_p50": rtt["rtt_ms_p50"],
        "rtt_ms_p95": rtt["rtt_ms_p95"],
        "rtt_samples": rtt["rtt_samples"],
        "spikes": len(result["spikes"]["up"]) + len(result["spikes"]["down"]),
        "shed_s_max": max(shed) if shed else None,
        "shed_s": {"client_leg": client_shed, "server_leg": server_shed},
        "client_receive": vars(peer.receive.stats),
    }


def holes_by_stall(
    received: np.ndarray,
    index_at: Callable[[float], float],
    stalls: list[tuple[float, float]],
    sample_rate: int = RTC_RATE,
) -> list[int]:
    """Holes in a tone heard from each stall's start to the next one's (the last: to the end).

    ``index_at`` maps a moment to the sample of ``received`` being heard then; ``stalls``
    are (start, release) moments. A stall's hole is heard a round trip after it starts, well
    before the next one, so each count is what that stall did.
    """
    bounds = [max(0, int(index_at(start))) for start, _ in sorted(stalls)] + [len(received)]
    return [
        len(holes(received[a:b], level=TONE_LEVEL / np.sqrt(2), sample_rate=sample_rate).lengths_ms)
        for a, b in itertools.pairwise(bounds)
        if b > a
    ]


def _marker_sent_times(markers: ChirpInserter, peer: PeerCall) -> list[float]:
    length = len(markers.template)
    timeline = peer.source.timeline
    return [timeline.time_of(s) for s in markers.marker_starts if s + length <= len(timeline)]


@dataclass(frozen=True)
class EchoScore:
    """PESQ-WB of echoed speech (None: ``pesq`` found no speech in it), and how the echo was
    aligned to what was sent: its lag in ``PESQ_RATE`` samples, and the correlation there."""

    pesq_wb: float | None
    lag: int
    corr: float


def echo_score(sent: np.ndarray, received: np.ndarray, skip_s: float) -> EchoScore | None:
    """Score ``received`` against ``sent`` (both 48 kHz mono) from ``skip_s`` on, the whole
    of it aligned at one lag; None when less than half of it came back."""
    reference = soxr.resample(sent, RTC_RATE, PESQ_RATE).astype(np.float32)
    heard = soxr.resample(received, RTC_RATE, PESQ_RATE).astype(np.float32)
    skip = int(skip_s * PESQ_RATE)
    reference = reference[skip:]
    if len(heard) < len(reference) // 2 or not len(reference):
        return None
    lag, corr = align(reference, heard[skip:], max_lag=PESQ_RATE)
    degraded = heard[skip + max(lag, 0) :][: len(reference)]
    reference = reference[max(-lag, 0) :][: len(degraded)]
    try:
        score: float | None = float(pesq(PESQ_RATE, reference, degraded, "wb"))
    except Exception as exc:  # pesq refuses audio it finds no speech in
        print(f"pesq failed: {exc}", file=sys.stderr)
        score = None
    return EchoScore(score, lag, corr)


def speech_row(result: dict[str, Any]) -> dict[str, Any]:
    peer: PeerCall = result["peer"]
    scored = echo_score(peer.sent(), peer.received(), result["impaired_from"] / RTC_RATE + SETTLE_S)
    if scored is None:
        return {"pesq_wb": None}
    score = None if scored.pesq_wb is None else round(scored.pesq_wb, 3)
    return {"pesq_wb": score, "align_corr": round(scored.corr, 3), "legs": result["legs"]}


async def run_server(
    url: str, ours: bool, profiles: list[str], seconds: float, speech_calls: int
) -> list[dict]:
    rows = []
    for profile in profiles:
        markers = ChirpInserter(interval_s=MARKER_INTERVAL_S)
        toned = await relayed_call(url, tone(seconds), profile, ours, markers)
        row: dict[str, Any] = {"server": "ours" if ours else "stock", "profile": profile}
        row.update(tone_row(toned, markers))
        spoken = [
            speech_row(await relayed_call(url, speech(seconds), profile, ours, None))
            for _ in range(speech_calls)
        ]
        scores = [call["pesq_wb"] for call in spoken]
        measured = [score for score in scores if score is not None]
        row["pesq_wb"] = round(statistics.median(measured), 3) if measured else None
        row["pesq_wb_range"] = f"{min(measured)}-{max(measured)}" if measured else None
        row["pesq_wb_calls"] = scores
        row["speech_calls"] = spoken
        row["trace"] = {
            "client": toned["trace"].client,
            "server": toned["trace"].server,
            "rtt": _rtt_series(toned, markers),
            "spikes": toned["spikes"],
            "start": toned["impaired_at"],
        }
        print(
            f"{row['server']:5} {profile:26} holes {row['holes']} silent {row['silent_pct']} % "
            f"rtt {row['rtt_ms_p50']}/{row['rtt_ms_p95']} ms "
            f"pesq {row.get('pesq_wb')} {row.get('pesq_wb_calls')} "
            f"shed {row['shed_s_max']} s",
            flush=True,
        )
        rows.append(row)
    return rows


def _rtt_series(result: dict[str, Any], markers: ChirpInserter) -> list[tuple[float, float]]:
    from peer.probe import detect_markers, rtt_from_markers

    peer: PeerCall = result["peer"]
    sent = _marker_sent_times(markers, peer)
    found = detect_markers(peer.received(), markers.template)
    received = [peer.recorder.timeline.time_of(i) for i in found]
    series = []
    for arrived in received:
        rtt = rtt_from_markers(sent, [arrived], max_rtt_s=markers.interval_s)
        if rtt:
            series.append((arrived, 1000 * rtt[0]))
    return series


def interrupts(count: int, seconds_in: float) -> dict[str, Any]:
    """Interrupt-to-silence at the listener: ``python -m server peer --interrupt-after``."""
    heard, after, wire, wire_after = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "silence.wav"
        write_wav(wav, np.zeros(int((seconds_in + 2.0) * RTC_RATE), np.float32), RTC_RATE)
        with server_process(
            ["--engine", "echo", "--engines", "echo", "piper", "--workers", "1"]
        ) as url:
            for index in range(count):
                delay = seconds_in + 0.0137 * index  # at different phases of the frame
                command = [sys.executable, "-m", "server", "peer", "--url", url]
                command += ["--engine", "piper", "--say", PARAGRAPH, "--input", str(wav)]
                command += ["--output", str(Path(tmp) / "out.wav"), "--ice-host", "127.0.0.1"]
                command += ["--interrupt-after", f"{delay:.3f}", "--json", "--tail", "0.5"]
                done = subprocess.run(
                    pinned(command, core=1), cwd=ROOT, capture_output=True, text=True, check=False
                )
                if done.returncode != 0:
                    print(f"peer failed: {done.stderr[-500:]}", file=sys.stderr)
                    continue
                report = json.loads(done.stdout.strip().splitlines()[-1])
                if report["interrupt_to_silence_ms"] is not None:
                    heard.append(report["interrupt_to_silence_ms"])
                    after.append(report["audible_after_silence_ms"])
                if report["interrupt_last_speech_packet_ms"] is not None:
                    wire.append(report["interrupt_last_speech_packet_ms"])
                    wire_after.append(report["interrupt_packets_after_silence"])
    return {
        "runs": len(heard),
        # On the wire (loopback: the peer's arrival is the server's send): the last packet
        # with sound after the message, and packets with sound after the first silent one.
        "last_speech_packet_ms": wire,
        "last_speech_packet_p50_ms": percentile(wire, 50),
        "last_speech_packet_p95_ms": percentile(wire, 95),
        "packets_after_silence_max": max(wire_after) if wire_after else None,
        "interrupt_to_silence_ms": heard,
        "p50_ms": percentile(heard, 50),
        "p95_ms": percentile(heard, 95),
        "audible_after_silence_ms_max": max(after) if after else None,
    }


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return False
    chosen = [r for r in rows if r["profile"] == PLOT_PROFILE]
    if not chosen:
        return False
    figure, axes = plt.subplots(len(chosen), 1, figsize=(10, 3.2 * len(chosen)), squeeze=False)
    for axis, row in zip(axes[:, 0], chosen, strict=True):
        trace = row["trace"]
        start = trace["start"]
        for direction, color in (("up", "tab:orange"), ("down", "tab:purple")):
            for begin, release in trace["spikes"][direction]:
                axis.axvspan(begin - start, release - start, color=color, alpha=0.25)
        if trace["rtt"]:
            t, rtt = zip(*trace["rtt"], strict=True)
            axis.plot(np.array(t) - start, rtt, "o-", color="black", label="round trip (markers)")
        for leg, color in (("client", "tab:blue"), ("server", "tab:green")):
            if trace[leg]:
                t, delay = zip(*trace[leg], strict=True)
                axis.plot(np.array(t) - start, delay, color=color, label=f"{leg} playout delay")
        axis.set_title(f"{row['server']}: {PLOT_PROFILE} (shaded: spikes, orange up, purple down)")
        axis.set_xlabel("seconds since the impairment started")
        axis.set_ylabel("ms")
        axis.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


async def calls(args: argparse.Namespace) -> list[dict[str, Any]]:
    accept_rsa_dtls_peers()
    restrict_host_addresses(["127.0.0.1"])
    rows: list[dict[str, Any]] = []
    if "ours" in args.servers:
        with server_process(["--engine", "echo", "--workers", "1"]) as url:
            rows += await run_server(url, True, args.profiles, args.seconds, args.speech_calls)
    if "stock" in args.servers:
        port = free_port()
        command = [sys.executable, "-m", "bench.stock_server", "--port", str(port)]
        with spawned_server(command, port, core=0, ready_path="offer") as handle:
            rows += await run_server(
                handle.url, False, args.profiles, args.seconds, args.speech_calls
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per call")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument(
        "--servers", nargs="+", default=["ours", "stock"], choices=["ours", "stock"]
    )
    parser.add_argument("--speech-calls", type=int, default=3, help="per profile (median)")
    parser.add_argument("--interrupts", type=int, default=20, help="Piper calls (0: none)")
    parser.add_argument("--interrupt-after", type=float, default=1.5)
    parser.add_argument("--name", default="netimpair", help="bench/results/NAME.json and .png")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})  # the relay and the peer; the server has core 0

    rows = asyncio.run(calls(args))
    interrupted = interrupts(args.interrupts, args.interrupt_after) if args.interrupts else None
    columns = ["server", "profile", "holes", "longest_hole_ms", "silent_pct", "rtt_ms_p50"]
    columns += ["rtt_ms_p95", "pesq_wb", "pesq_wb_range", "spikes", "late_stall_holes"]
    columns += ["shed_s_max"]
    print()
    print_table(rows, columns)
    if interrupted:
        print(
            f"\ninterrupt to silence at the listener ({interrupted['runs']} runs): "
            f"p50 {interrupted['p50_ms']} ms, p95 {interrupted['p95_ms']} ms; audible after "
            f"the first silent frame: {interrupted['audible_after_silence_ms_max']} ms at most"
        )
        print(
            f"interrupt to the last speech packet on the wire: p50 "
            f"{interrupted['last_speech_packet_p50_ms']} ms, p95 "
            f"{interrupted['last_speech_packet_p95_ms']} ms; packets with sound after the "
            f"first silent one: {interrupted['packets_after_silence_max']} at most"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    plotted = plot(rows, RESULTS / f"{args.name}.png")
    path = write_results(
        args.name,
        {
            "benchmark": "netimpair",
            "seconds_per_call": args.seconds,
            "speech_calls": args.speech_calls,
            "machine": platform.platform(),
            "profiles": {name: vars(PROFILES[name]) for name in args.profiles},
            "rows": rows,
            "interrupts": interrupted,
            "plot": f"{args.name}.png" if plotted else None,
        },
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
