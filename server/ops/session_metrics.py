"""Session metrics of one process, summed per engine when the metrics are read.

The media path never touches a metrics library. Sessions already count what happens to
their audio (receive stats, pipeline stats, pacer underruns) and keep cheap cumulative
histograms (``media.pipeline.stages``); :class:`SessionCollector` adds those up per engine when the
metrics are read, and once a second otherwise. A session that closes is removed from the
session manager, so the collector keeps every session it has seen until it notices the
close, then folds its final counts into per-engine totals: counters never go backwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from media.audio.frames import FRAME_SAMPLES
from media.pipeline.stages import DurationHistogram
from server.sessions.manager import SessionManager
from server.sessions.session import Session

PREFIX = "cosyrtc"
RECONCILE_SECONDS = 1.0
REFRESH_BATCH = 16  # sessions read per turn of the event loop when scraped

# Per-session counters: name -> help. Exposed as ``cosyrtc_<name>_total{engine}``.
SESSION_COUNTERS = {
    "packets_received": "RTP audio packets received from callers.",
    "frames_received": "20 ms frames the receive path handed on (decoded or concealed).",
    "frames_concealed": "Frames concealed (in-band FEC or PLC) for lost packets.",
    "packets_late": "Packets dropped because their slot had already been concealed.",
    "packets_duplicate": "Duplicate packets dropped.",
    "packets_over_real_time": "Packets beyond real time (plus a burst), dropped undecoded.",
    "packets_undecodable": "Packets that were not decodable audio, concealed as lost.",
    "frames_dropped": "Input frames dropped from a full engine queue (oldest first).",
    "frames_sent": "Frames sent on outgoing tracks, filler silence included.",
    "frames_silence": "Filler silence frames sent.",
    "underruns": "Output slots that ended with no audio ready (sent as silence).",
    "backlog_dropped_seconds": "Output audio dropped to keep a transform's latency bounded.",
    "engine_errors": "Engine calls or syntheses that failed.",
    "resumes": "Sessions continued on a new connection after a dropped one.",
    "socket_frames_dropped": "Socket sessions: frames dropped for a client that took none.",
    "socket_frames_resent": "Socket sessions: unacknowledged frames sent again on a resume.",
    "socket_backpressure": "Socket sessions: backpressure messages sent to clients.",
}
# Per-session histograms: name -> help. Exposed as ``cosyrtc_<name>{engine}``.
SESSION_HISTOGRAMS = {
    "engine_call_seconds": "Engine time per call (transforms) or per synthesised chunk (speak).",
    "in_to_out_seconds": "Transform frames: packet arrival to encoded frame sent.",
    "tts_first_audio_seconds": "Speak sessions: text received to its first audio frame sent.",
    "tts_interrupt_to_silence_seconds": "Speak sessions: interrupt to a silent outgoing track.",
}


def session_counters(session: Session) -> dict[str, float]:
    """The cumulative counts of one session, under the names of ``SESSION_COUNTERS``."""
    pipeline = session.pipeline
    receive, output = pipeline.receive_stats, pipeline.output
    counts = {
        "packets_received": receive.packets,
        "frames_received": receive.frames,
        "frames_concealed": receive.concealed,
        "packets_late": receive.late_dropped,
        "packets_duplicate": receive.duplicates,
        "packets_over_real_time": receive.over_real_time,
        "packets_undecodable": receive.undecodable,
        "frames_sent": output.frames_sent,
        "frames_silence": output.silence_sent,
        "underruns": pipeline.underruns,
        "backlog_dropped_seconds": pipeline.backlog_dropped_seconds,
        "resumes": session.resumes,
    }
    counters = pipeline.counters()
    counts.update(frames_dropped=counters.input_dropped, engine_errors=counters.engine_errors)
    socket = session.socket_output
    counts.update(
        socket_frames_dropped=socket.frames_dropped if socket else 0,
        socket_frames_resent=socket.frames_resent if socket else 0,
        socket_backpressure=socket.backpressure_sent if socket else 0,
    )
    return counts


def session_histograms(session: Session) -> dict[str, DurationHistogram]:
    """The session's cumulative histograms, under the names of ``SESSION_HISTOGRAMS``."""
    return session.pipeline.histograms()


@dataclass
class _Tracked:
    """A session being counted; ``base`` carries counts across a reset receive path.

    A resumed session gets a new receive path whose counters start again at zero; what the
    old one had counted (as last read) moves into ``base``.
    """

    session: Session
    base: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def read(self) -> dict[str, float]:
        current = session_counters(self.session)
        for name, value in current.items():
            if value < self.last.get(name, 0.0):
                self.base[name] = self.base.get(name, 0.0) + self.last[name]
        self.last = current
        return {name: value + self.base.get(name, 0.0) for name, value in current.items()}


@dataclass
class _EngineTotals:
    """What one engine's sessions counted: the closed ones, or all of them in a snapshot."""

    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SESSION_COUNTERS, 0))
    histograms: dict[str, DurationHistogram] = field(
        default_factory=lambda: {name: DurationHistogram() for name in SESSION_HISTOGRAMS}
    )
    created: int = 0
    closed: dict[str, int] = field(default_factory=dict)  # by reason

    def add(self, counts: dict[str, float], histograms: dict[str, DurationHistogram]) -> None:
        for name, value in counts.items():
            self.counters[name] += value
        for name, histogram in histograms.items():
            self.histograms[name].add(histogram)


class SessionCollector(Collector):
    """Per-engine session metrics: live sessions read when asked, closed ones folded in."""

    def __init__(self, manager: SessionManager) -> None:
        self._manager = manager
        self._tracked: dict[str, _Tracked] = {}
        self._closed: dict[str, _EngineTotals] = {}
        self._snapshot = _Snapshot()

    def _totals(self, engine: str) -> _EngineTotals:
        if engine not in self._closed:
            self._closed[engine] = _EngineTotals()
        return self._closed[engine]

    def adopt(self, session: Session) -> None:
        """Start counting ``session`` (once; a session seen again is not new)."""
        if session.id in self._tracked or session.closed.is_set():
            return
        self._tracked[session.id] = _Tracked(session)
        self._totals(session.engine.name).created += 1

    def reconcile(self) -> None:
        """Adopt live sessions not seen yet; fold the closed ones' final counts into totals."""
        for session in self._manager.live_sessions():
            self.adopt(session)
        for session_id, tracked in list(self._tracked.items()):
            if tracked.session.closed.is_set():
                del self._tracked[session_id]
                totals = self._totals(tracked.session.engine.name)
                totals.add(tracked.read(), session_histograms(tracked.session))
                reason = tracked.session.close_reason or "unknown"
                totals.closed[reason] = totals.closed.get(reason, 0) + 1

    async def refresh(self) -> None:
        """Take the sums now, on the event loop; ``collect`` (in any thread) formats them.

        Sessions are read ``REFRESH_BATCH`` at a time with the loop let go in between, so
        a scrape of many sessions never holds it for long. A session that closes meanwhile
        is still counted once: the closed totals were copied before the reading began.
        """
        self.reconcile()
        snapshot = _Snapshot()
        for engine, closed in self._closed.items():
            totals = snapshot.engine(engine)
            totals.created, totals.closed = closed.created, dict(closed.closed)
            totals.add(closed.counters, closed.histograms)
        for index, tracked in enumerate(list(self._tracked.values())):
            if index and index % REFRESH_BATCH == 0:
                await asyncio.sleep(0)
            snapshot.add_live(tracked)
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return self._snapshot.families()

    async def run(self) -> None:
        """Fold closed sessions in once a second, so none is held long after it ended."""
        while True:
            await asyncio.sleep(RECONCILE_SECONDS)
            self.reconcile()


@dataclass
class _Snapshot:
    """Per-engine sums at one moment, from which the metric families are written."""

    per_engine: dict[str, _EngineTotals] = field(default_factory=dict)
    live: dict[tuple[str, str], int] = field(default_factory=dict)
    input_queued: dict[str, int] = field(default_factory=dict)
    output_queued: dict[str, float] = field(default_factory=dict)

    def engine(self, name: str) -> _EngineTotals:
        if name not in self.per_engine:
            self.per_engine[name] = _EngineTotals()
        return self.per_engine[name]

    def add_live(self, tracked: _Tracked) -> None:
        session = tracked.session
        engine = session.engine.name
        self.engine(engine).add(tracked.read(), session_histograms(session))
        if not session.closed.is_set():
            key = (engine, session.engine.kind.value)
            self.live[key] = self.live.get(key, 0) + 1
        pipeline = session.pipeline
        queued = pipeline.counters().input_queued
        if queued is not None:
            self.input_queued[engine] = self.input_queued.get(engine, 0) + queued
        frames = pipeline.output.buffer.available / FRAME_SAMPLES
        self.output_queued[engine] = self.output_queued.get(engine, 0.0) + frames

    def families(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily(
            f"{PREFIX}_sessions_live", "Sessions open now.", labels=["engine", "kind"]
        )
        for (engine, kind), count in sorted(self.live.items()):
            sessions.add_metric([engine, kind], count)
        yield sessions
        created = CounterMetricFamily(
            f"{PREFIX}_sessions_created", "Sessions opened.", labels=["engine"]
        )
        closed = CounterMetricFamily(
            f"{PREFIX}_sessions_closed", "Sessions ended, by reason.", labels=["engine", "reason"]
        )
        engines = sorted(self.per_engine.items())
        for engine, totals in engines:
            created.add_metric([engine], totals.created)
            for reason, count in sorted(totals.closed.items()):
                closed.add_metric([engine, reason], count)
        yield created
        yield closed
        for name, documentation in SESSION_COUNTERS.items():
            family = CounterMetricFamily(f"{PREFIX}_{name}", documentation, labels=["engine"])
            for engine, totals in engines:
                family.add_metric([engine], totals.counters[name])
            yield family
        for name, documentation in SESSION_HISTOGRAMS.items():
            histograms = HistogramMetricFamily(f"{PREFIX}_{name}", documentation, labels=["engine"])
            for engine, totals in engines:
                histogram = totals.histograms[name]
                if histogram.count:  # an engine's kind has half of them: skip the empty ones
                    buckets = [(_le(bound), float(n)) for bound, n in histogram.cumulative()]
                    histograms.add_metric([engine], buckets, histogram.sum)
            yield histograms
        queued = GaugeMetricFamily(
            f"{PREFIX}_queued_frames",
            "Audio waiting, in 20 ms frames: 'input' for the engine, 'output' for its slot.",
            labels=["engine", "queue"],
        )
        for engine, frames in sorted(self.input_queued.items()):
            queued.add_metric([engine, "input"], frames)
        for engine, buffered in sorted(self.output_queued.items()):
            queued.add_metric([engine, "output"], round(buffered, 3))
        yield queued


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
