"""Echoed speech through both receive paths of a call, on a virtual clock: PESQ-WB and delay.

    .venv/bin/python -m bench.playout_sim [--profiles clean loss2_jitter30 ...] [--seeds 12]
        [--seconds 15]

``bench.netimpair`` measures real calls, and a real call's score moves with the machine:
through the same relay seed, echoed speech on ``loss2_jitter30`` scored from 3.0 to 4.1 a
call, so telling two versions of the receive path apart takes many minutes of calls. This
runs the two legs of the same echo call with no machine in the loop, in about a second a
call, and gives the same answer every time:

- the caller's packets (the peer's Opus coding) leave on an exact 20 ms grid and cross the
  relay's own link model (``tests.netfaults.relay.Link``: the same loss, jitter, bursts and
  spikes as ``bench.netimpair``'s profiles) to the server's receive path
  (``media.rtc.receive.AudioReceivePath``);
- every frame that path hands on is coded again (the server's Opus settings) and sent at
  that moment, as an echo session sends it, across a second link to the peer's receive path;
- both paths and both links run on one virtual clock, so their timers fire exactly when due.

Per profile, over ``--seeds`` seeds (each seed draws both links' impairments): PESQ-WB of
what the peer played against what was sent (16 kHz, the whole call aligned, the first
second left out as in ``bench.netimpair``); the mouth-to-ear delay (median over the frames
played, from that alignment); and what each leg did (late packets, concealed ones and how
many of those FEC rebuilt, milliseconds expanded, accelerated and grown).

What it leaves out, so compare an absolute figure with ``bench.netimpair`` before relying on
it: the event loops' scheduling noise at both ends; the server's output pacer and cushion
(an echo's frames leave when the receive path hands them on, as they do while the
cushion's target is at its floor); and FEC starting at the first loss (here the encoders
code copies from the start on a lossy profile, at ``FEC_PERCENT``). It is for comparing
versions of the playout code and for finding out why a live figure is what it is. Against
``bench.netimpair``'s live medians it came within 0.05-0.25 of PESQ-WB on every profile
(clean 4.13 / 4.09 live, loss2_jitter30 3.58 / 3.40-3.65 over four live runs,
loss5_jitter50 2.79 / 2.89, wifi_spikes 1.36 / 1.32), and its delay 2-8 ms under the
live round trip. It rates a change by about what it is worth live, though not exactly:
holding a frame for FEC copies after a loss (``media.rtc.receive.LOSS_HOLD_S``) moved
loss2_jitter30 from 3.58 to 3.96 here, and live from 3.35 to 3.74 (eight calls each, run
one after the other; two more live runs with the hold 3.61 and 3.65). On profiles with
delay spikes the one alignment of the whole call cannot follow the delay, and the delay
figure means nothing there.
Results: a table and ``bench/results/playout_sim.json``.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.common import print_table, write_results
from bench.netimpair import (
    PESQ_RATE,
    PROFILES,
    SETTLE_S,
    TONE_LEVEL,
    echo_score,
    holes_by_stall,
    leg_counts,
    speech,
    tone,
)
from media.audio.frames import FRAME_SAMPLES, RTC_RATE
from media.audio.opus import OpusEncoder
from media.pipeline.base import ReceiveStats
from media.rtc.receive import AudioReceivePath
from peer.filetracks import PEER_BITRATE
from peer.probe import holes
from server.sessions.manager import DEFAULT_BITRATE
from tests.netfaults.relay import Impairment, Link, share_spikes

START_S = 1.0  # virtual time of the first packet
DRAIN_S = 2.0  # virtual time run after the last packet is sent
FEC_PERCENT = 5  # the loss both encoders plan for on a lossy profile
SERVER_COMPLEXITY = 4  # server.sessions.manager.opus_encoder_for's default


class _Timer:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualLoop:
    """The part of an event loop the receive path and the relay's links use, on a clock
    that jumps from one timer to the next."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        return self.call_at(self.now + delay, callback)

    def run_until(self, moment: float) -> None:
        """Fire every timer due by ``moment``, each at its own time, in order."""
        while self._timers and self._timers[0][0] <= moment:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.now = max(self.now, when)
                timer.callback()
        self.now = moment


def _encoder(bitrate: int, lossy: bool, complexity: int | None = None) -> OpusEncoder:
    encoder = OpusEncoder(
        channels=1, bitrate=bitrate, fec=True, expected_loss_percent=FEC_PERCENT if lossy else 0
    )
    if complexity is not None:
        encoder.set_complexity(complexity)
    return encoder


@dataclass
class EchoCall:
    """One simulated echo call: the peer's sent audio through both legs, and when each frame
    the peer played was handed to it."""

    played: list[np.ndarray] = field(default_factory=list)
    played_at: list[float] = field(default_factory=list)
    server: ReceiveStats = field(default_factory=ReceiveStats)
    client: ReceiveStats = field(default_factory=ReceiveStats)
    stalls: list[tuple[float, float]] = field(default_factory=list)  # both legs', in order
    # Each leg's playout delay (server, client) when the caller sent its last frame: what
    # the call held, before the end of the stream (waited for, then faded) moves it.
    playout_ms: tuple[float, float] = (0.0, 0.0)

    def heard(self) -> np.ndarray:
        return np.concatenate(self.played) if self.played else np.zeros(0, np.float32)

    def index_at(self, moment: float) -> float:
        """The sample of :meth:`heard` being played at ``moment``."""
        return float(np.searchsorted(self.played_at, moment)) * FRAME_SAMPLES


PEAK_LEGS = {"both": (True, True), "server": (True, False), "peer": (False, True)}
PEAK_LEGS["none"] = (False, False)


def simulate(
    audio: np.ndarray,
    impairment: Impairment,
    seed: int,
    peak_legs: str = "both",
    server_leg: str = "relay",
) -> EchoCall:
    """Echo ``audio`` (48 kHz mono) through both legs impaired alike; ``seed`` draws both
    links' fates; ``peak_legs``: which receive paths hold the target over recurring delay
    peaks; ``server_leg``: ``relay`` passes a stall on (the server's transform paths do),
    ``buffer`` holds it as any receive path does."""
    server_peaks, peer_peaks = PEAK_LEGS[peak_legs]
    loop = VirtualLoop()
    lossy = impairment.loss > 0 or impairment.burst_loss > 0
    call = EchoCall()
    # asyncio's loop type is what the links are written against; this one has what they use.
    up = Link("up", seed, loop)  # type: ignore[arg-type]
    down = Link("down", seed, loop)  # type: ignore[arg-type]
    share_spikes(impairment, up, down)

    def hear(frame: np.ndarray) -> None:
        call.played.append(np.asarray(frame, np.float32).reshape(-1))
        call.played_at.append(loop.now)

    client = AudioReceivePath(hear, clock=loop.time, call_at=loop.call_at, peak_mode=peer_peaks)
    server_encoder = _encoder(DEFAULT_BITRATE, lossy, SERVER_COMPLEXITY)
    echoed = itertools.count()

    def echo(frame: np.ndarray) -> None:
        # Numbered by packet and stamped by slot, as the server's sender and pacer do: the
        # slots the server skipped are a jump in time, not lost packets.
        seq = next(echoed)
        timestamp = (seq + server.stats.skipped_slots) * FRAME_SAMPLES
        payload = server_encoder.encode(np.asarray(frame, np.float32).reshape(-1))
        down.submit(functools.partial(client.receive, seq, timestamp, payload))

    server = AudioReceivePath(
        echo,
        clock=loop.time,
        call_at=loop.call_at,
        peak_mode=server_peaks,
        relay_stalls=server_leg == "relay",
    )
    peer_encoder = _encoder(PEER_BITRATE, lossy)
    frames = len(audio) // FRAME_SAMPLES
    for index in range(frames):
        sent_at = START_S + index * FRAME_SAMPLES / RTC_RATE
        loop.run_until(sent_at)
        payload = peer_encoder.encode(audio[index * FRAME_SAMPLES : (index + 1) * FRAME_SAMPLES])
        up.submit(functools.partial(server.receive, index, index * FRAME_SAMPLES, payload))
    call.playout_ms = (server.stats.delay_ms, client.stats.delay_ms)
    loop.run_until(START_S + frames * FRAME_SAMPLES / RTC_RATE + DRAIN_S)
    call.server, call.client = server.stats, client.stats
    call.stalls = sorted(set(up.spikes) | set(down.spikes))
    server.close()
    client.close()
    return call


def measure(audio: np.ndarray, call: EchoCall) -> dict[str, Any]:
    """PESQ-WB of what the peer played against ``audio``, and the mouth-to-ear delay."""
    scored = echo_score(audio, call.heard(), SETTLE_S)
    if scored is None or scored.pesq_wb is None:
        raise RuntimeError("no speech came back from the simulated call")
    # Frame j of what was played starts at played sample j * FRAME_SAMPLES, which carries
    # sent sample j * FRAME_SAMPLES - lag (at 48 kHz), sent at START_S + that / RTC_RATE.
    lag_48k = scored.lag * RTC_RATE / PESQ_RATE
    starts = np.arange(len(call.played_at)) * FRAME_SAMPLES - lag_48k
    delays = np.asarray(call.played_at) - (START_S + starts / RTC_RATE)
    audible = starts >= 0
    delay_ms = round(float(np.median(delays[audible])) * 1000, 1) if audible.any() else None
    return {"pesq_wb": round(scored.pesq_wb, 3), "delay_ms": delay_ms}


def tone_holes(
    seconds: float, impairment: Impairment, seed: int, peak_legs: str, server_leg: str
) -> dict[str, Any]:
    """A tone through the same legs: its holes (after ``SETTLE_S``, the drain left out)
    and the holes each stall opened."""
    sent = tone(seconds)
    call = simulate(sent, impairment, seed, peak_legs, server_leg)
    heard = call.heard()[: len(sent)]
    found = holes(heard[int(SETTLE_S * RTC_RATE) :], level=TONE_LEVEL / np.sqrt(2))
    by_stall = holes_by_stall(heard, call.index_at, call.stalls)
    return {
        "holes": len(found.lengths_ms),
        "silent_pct": round(100 * found.silent_share, 2),
        "holes_by_stall": by_stall,
        "late_stall_holes": sum(by_stall[2:]),
    }


def profile_row(
    name: str, audio: np.ndarray, seeds: int, peak_legs: str, server_leg: str
) -> dict[str, Any]:
    calls = []
    seconds = len(audio) / RTC_RATE
    for seed in range(seeds):
        call = simulate(audio, PROFILES[name], seed, peak_legs, server_leg)
        calls.append(
            {
                **measure(audio, call),
                "tone": tone_holes(seconds, PROFILES[name], seed, peak_legs, server_leg),
                "legs": {
                    "server": leg_counts(vars(call.server)),
                    "client": leg_counts(vars(call.client)),
                },
            }
        )
    scores = [call["pesq_wb"] for call in calls]
    delays = [call["delay_ms"] for call in calls if call["delay_ms"] is not None]

    def median_count(leg: str, key: str) -> float:
        return statistics.median(call["legs"][leg][key] for call in calls)

    tones = [call["tone"] for call in calls]
    return {
        "profile": name,
        "peak_legs": peak_legs,
        "server_leg": server_leg,
        "holes": sum(t["holes"] for t in tones),
        "silent_pct": round(statistics.median(t["silent_pct"] for t in tones), 2),
        "late_stall_holes": sum(t["late_stall_holes"] for t in tones),
        "pesq_wb": round(statistics.median(scores), 3),
        "pesq_wb_range": f"{min(scores)}-{max(scores)}",
        "delay_ms": round(statistics.median(delays), 1) if delays else None,
        "server_late": median_count("server", "late_dropped"),
        "server_concealed": median_count("server", "concealed"),
        "server_fec": median_count("server", "recovered_fec"),
        "client_late": median_count("client", "late_dropped"),
        "client_concealed": median_count("client", "concealed"),
        "client_fec": median_count("client", "recovered_fec"),
        "client_accelerated_ms": median_count("client", "accelerated_ms"),
        "calls": calls,
    }


COLUMNS = (
    "profile",
    "peak_legs",
    "server_leg",
    "holes",
    "silent_pct",
    "late_stall_holes",
    "pesq_wb",
    "pesq_wb_range",
    "delay_ms",
    "server_late",
    "server_concealed",
    "server_fec",
    "client_late",
    "client_concealed",
    "client_fec",
    "client_accelerated_ms",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--seeds", type=int, default=12, help="calls per profile (median)")
    parser.add_argument("--seconds", type=float, default=15.0, help="per call")
    parser.add_argument(
        "--peak-legs",
        nargs="+",
        default=["both"],
        choices=list(PEAK_LEGS),
        help="which receive paths run the delay-peak mode (one row per choice)",
    )
    parser.add_argument(
        "--server-leg",
        nargs="+",
        default=["relay"],
        choices=["relay", "buffer"],
        help="relay: the server passes a stall on; buffer: it holds it (one row per choice)",
    )
    parser.add_argument("--name", default="playout_sim", help="bench/results/NAME.json")
    args = parser.parse_args()
    audio = speech(args.seconds).astype(np.float32)
    rows = []
    for name in args.profiles:
        for peak_legs in args.peak_legs:
            for server_leg in args.server_leg:
                rows.append(profile_row(name, audio, args.seeds, peak_legs, server_leg))
                print_table(rows[-1:], COLUMNS)
    print()
    print_table(rows, COLUMNS)
    path = write_results(
        args.name,
        {
            "benchmark": "playout_sim",
            "seconds_per_call": args.seconds,
            "seeds": args.seeds,
            "machine": platform.platform(),
            "rows": rows,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
