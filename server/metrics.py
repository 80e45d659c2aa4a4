"""Prometheus metrics of one server process: sessions, frames, latencies, the loop, the process.

The media path never touches a metrics library. Sessions already count what happens to
their audio (receive stats, pipeline stats, pacer underruns) and keep cheap cumulative
histograms (``media.stages``); :class:`SessionCollector` adds those up per engine when the
metrics are read, and once a second otherwise. A session that closes is removed from the
session manager, so the collector keeps every session it has seen until it notices the
close, then folds its final counts into per-engine totals: counters never go backwards.

Reading is split in two: the sums are taken on the event loop (plain attribute reads,
microseconds per session), the text is formatted in a thread (formatting hundreds of
samples, and reading ``/proc`` for the process metrics, would hold the loop too long).

Offers are counted by a middleware on the session-creating routes, not inside the session
manager: a refused offer raises :class:`ApiError`, whose code is the rejection reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from media.frames import FRAME_SAMPLES, RTC_RATE
from media.pipeline import TransformPipeline
from media.stages import DurationHistogram
from server.session import Session
from server.sessions import SessionManager
from signaling.errors import ApiError, Handler

PREFIX = "cosyrtc"
SESSION_CREATING_ROUTES = frozenset({"/offer", "/whip", "/whip/{engine}"})
RECONCILE_SECONDS = 1.0
LOOP_LAG_INTERVAL_SECONDS = 0.1
LOOP_LAG_RECENT = 100  # ten seconds of readings for the recent maximum
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)

# Per-session counters: name -> help. Exposed as ``cosyrtc_<name>_total{engine}``.
SESSION_COUNTERS = {
    "packets_received": "RTP audio packets received from callers.",
    "frames_received": "20 ms frames the receive path handed on (decoded or concealed).",
    "frames_concealed": "Frames concealed (in-band FEC or PLC) for lost packets.",
    "packets_late": "Packets dropped because their slot had already been concealed.",
    "packets_duplicate": "Duplicate packets dropped.",
    "frames_dropped": "Input frames dropped from a full engine queue (oldest first).",
    "frames_sent": "Frames sent on outgoing tracks, filler silence included.",
    "frames_silence": "Filler silence frames sent.",
    "underruns": "Output slots that ended with no audio ready (sent as silence).",
    "backlog_dropped_seconds": "Output audio dropped to keep a transform's latency bounded.",
    "engine_errors": "Engine calls or syntheses that failed.",
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
        "frames_sent": output.frames_sent,
        "frames_silence": output.silence_sent,
        "underruns": output.pacer.underruns,
        "backlog_dropped_seconds": output.pacer.backlog_dropped / RTC_RATE,
    }
    if isinstance(pipeline, TransformPipeline):
        stats = pipeline.stats
        counts.update(frames_dropped=stats.input_dropped, engine_errors=stats.engine_errors)
    else:
        counts.update(frames_dropped=0, engine_errors=pipeline.stats.synthesis_errors)
    return counts


def session_histograms(session: Session) -> dict[str, DurationHistogram]:
    """The session's cumulative histograms, under the names of ``SESSION_HISTOGRAMS``."""
    pipeline = session.pipeline
    if isinstance(pipeline, TransformPipeline):
        stages = pipeline.stages
        return {"engine_call_seconds": stages.engine_calls, "in_to_out_seconds": stages.in_to_out}
    speak = pipeline.stages
    return {
        "engine_call_seconds": speak.synthesis,
        "tts_first_audio_seconds": speak.first_audio,
        "tts_interrupt_to_silence_seconds": speak.interrupt_to_silence,
    }


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
    """Everything one engine's closed sessions counted."""

    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SESSION_COUNTERS, 0))
    histograms: dict[str, DurationHistogram] = field(
        default_factory=lambda: {name: DurationHistogram() for name in SESSION_HISTOGRAMS}
    )
    created: int = 0
    closed: int = 0

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
        self._families: list[Metric] = []

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
                totals.closed += 1

    def refresh(self) -> None:
        """Take the sums now, on the event loop; ``collect`` (in any thread) yields them."""
        self.reconcile()
        per_engine: dict[str, _EngineTotals] = {}
        for engine, closed in self._closed.items():
            totals = per_engine[engine] = _EngineTotals(created=closed.created)
            totals.closed = closed.closed
            totals.add(closed.counters, closed.histograms)
        live: dict[tuple[str, str], int] = {}
        input_queued: dict[str, int] = {}
        output_queued: dict[str, float] = {}
        for tracked in self._tracked.values():
            session = tracked.session
            engine = session.engine.name
            if engine not in per_engine:
                per_engine[engine] = _EngineTotals()
            per_engine[engine].add(tracked.read(), session_histograms(session))
            key = (engine, session.engine.kind.value)
            live[key] = live.get(key, 0) + 1
            pipeline = session.pipeline
            if isinstance(pipeline, TransformPipeline):
                input_queued[engine] = input_queued.get(engine, 0) + pipeline.stages.queued
            frames = pipeline.output.buffer.available / FRAME_SAMPLES
            output_queued[engine] = output_queued.get(engine, 0.0) + frames
        self._families = list(_families(per_engine, live, input_queued, output_queued))

    def collect(self) -> Iterator[Metric]:
        yield from self._families

    async def run(self) -> None:
        """Fold closed sessions in once a second, so none is held long after it ended."""
        while True:
            await asyncio.sleep(RECONCILE_SECONDS)
            self.reconcile()


def _families(
    per_engine: dict[str, _EngineTotals],
    live: dict[tuple[str, str], int],
    input_queued: dict[str, int],
    output_queued: dict[str, float],
) -> Iterator[Metric]:
    sessions = GaugeMetricFamily(
        f"{PREFIX}_sessions_live", "Sessions open now.", labels=["engine", "kind"]
    )
    for (engine, kind), count in sorted(live.items()):
        sessions.add_metric([engine, kind], count)
    yield sessions
    created = CounterMetricFamily(
        f"{PREFIX}_sessions_created", "Sessions opened.", labels=["engine"]
    )
    closed = CounterMetricFamily(f"{PREFIX}_sessions_closed", "Sessions ended.", labels=["engine"])
    for engine, totals in sorted(per_engine.items()):
        created.add_metric([engine], totals.created)
        closed.add_metric([engine], totals.closed)
    yield created
    yield closed
    for name, documentation in SESSION_COUNTERS.items():
        family = CounterMetricFamily(f"{PREFIX}_{name}", documentation, labels=["engine"])
        for engine, totals in sorted(per_engine.items()):
            family.add_metric([engine], totals.counters[name])
        yield family
    for name, documentation in SESSION_HISTOGRAMS.items():
        family = HistogramMetricFamily(f"{PREFIX}_{name}", documentation, labels=["engine"])
        for engine, totals in sorted(per_engine.items()):
            histogram = totals.histograms[name]
            buckets = [(_le(bound), count) for bound, count in histogram.cumulative()]
            family.add_metric([engine], buckets, histogram.sum)
        yield family
    queued = GaugeMetricFamily(
        f"{PREFIX}_queued_frames",
        "Audio waiting, in 20 ms frames: 'input' for the engine, 'output' for its slot.",
        labels=["engine", "queue"],
    )
    for engine, frames in sorted(input_queued.items()):
        queued.add_metric([engine, "input"], frames)
    for engine, frames in sorted(output_queued.items()):
        queued.add_metric([engine, "output"], round(frames, 3))
    yield queued


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class LoopLagMonitor:
    """How late the event loop wakes a task that sleeps 100 ms: the loop's own latency.

    Anything that holds the loop (a slow callback, a blocking call) delays every packet and
    frame of every session in this process by as much; this shows it.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._histogram = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late a 100 ms sleep on the event loop wakes up.",
            buckets=LOOP_LAG_BUCKETS,
            registry=registry,
        )
        recent_max = Gauge(
            f"{PREFIX}_event_loop_lag_max_seconds",
            "The largest event-loop lag of the last ten seconds.",
            registry=registry,
        )
        self._recent: list[float] = []
        recent_max.set_function(lambda: max(self._recent, default=0.0))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            await asyncio.sleep(LOOP_LAG_INTERVAL_SECONDS)
            lag = max(0.0, loop.time() - began - LOOP_LAG_INTERVAL_SECONDS)
            self._histogram.observe(lag)
            self._recent = [*self._recent[-(LOOP_LAG_RECENT - 1) :], lag]


class ProcessMetrics:
    """The metrics registry of one process (a worker, a single server, or the front).

    Each process has its own registry rather than the library's global one, so several
    servers in one process (tests) never share or collide.
    """

    def __init__(self, manager: SessionManager | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.rejected = Counter(
            f"{PREFIX}_sessions_rejected",
            "Offers refused, by reason (the error code the client got).",
            labelnames=["reason"],
            registry=self.registry,
        )
        self.loop_lag = LoopLagMonitor(self.registry)
        self.sessions = SessionCollector(manager) if manager is not None else None
        if self.sessions is not None:
            self.registry.register(self.sessions)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self.loop_lag.run(), name="loop-lag"))
        if self.sessions is not None:
            self._tasks.append(asyncio.create_task(self.sessions.run(), name="metrics"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def exposition(self) -> bytes:
        """The text format, summed on the loop and formatted in a thread."""
        if self.sessions is not None:
            self.sessions.refresh()
        return await asyncio.to_thread(generate_latest, self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        """``GET /metrics``."""
        response = web.Response(body=await self.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    def offer_counter(
        self, on_created: Callable[[web.Request, web.StreamResponse], None] | None
    ) -> Middleware:
        """A middleware counting refused offers by code, and calling ``on_created`` on 2xx.

        It must sit inside ``json_errors``: it sees the ``ApiError`` a refusal raises (from
        the handler or from any middleware inside it) and re-raises it for rendering.
        """

        @web.middleware
        async def count_offers(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.method != "POST" or _route(request) not in SESSION_CREATING_ROUTES:
                return await handler(request)
            try:
                response = await handler(request)
            except ApiError as exc:
                self.rejected.labels(exc.code).inc()
                raise
            except web.HTTPException as exc:
                if exc.status >= 400:
                    self.rejected.labels(f"http_{exc.status}").inc()
                raise
            if on_created is not None and 200 <= response.status < 300:
                on_created(request, response)
            return response

        return count_offers


def _route(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def created_session_id(response: web.StreamResponse) -> str | None:
    """The id of the session an offer created: WHIP's ``Location``, or the JSON answer's."""
    location = response.headers.get("Location")
    if location:
        return location.rstrip("/").rsplit("/", 1)[-1]
    body = getattr(response, "body", None)
    if not isinstance(body, bytes):
        return None
    with contextlib.suppress(ValueError):
        payload = json.loads(body)
        if isinstance(payload, dict) and isinstance(payload.get("session_id"), str):
            return payload["session_id"]
    return None


def adopt_created(
    manager: SessionManager, collector: SessionCollector
) -> Callable[[web.Request, web.StreamResponse], None]:
    """``on_created`` for a process that owns sessions: count the new one from now on."""

    def on_created(request: web.Request, response: web.StreamResponse) -> None:
        session_id = created_session_id(response)
        if session_id is None:
            return
        with contextlib.suppress(ApiError):  # closed already: reconcile never sees it
            collector.adopt(manager.get(session_id))

    return on_created
