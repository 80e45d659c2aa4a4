"""One task sends every WebRTC session's audio of a worker: the media tick.

aiortc gives each sender its own coroutine, woken for each frame through the track, the
pacer's wait (an ``asyncio`` timeout per frame) and three awaits down to the socket. With
many calls per process those wake-ups, not the codec, are most of a call's CPU. Here each
session's outgoing audio is a pacer stepped synchronously (``OutboundAudio.poll_frame``):
the tick keeps one timer for the earliest slot any session waits on, and a session whose
audio is written before then is served on the next turn of the loop, with every other
session woken in the same turn. Sessions are phase-spread by construction: each pacer's
slots are anchored where its own frames become ready (its caller's packets), so the work
comes as the calls' packets do, not in one burst every 20 ms.

A session whose output ends, or whose sending fails in a way that is not a dropped
connection, leaves the tick; the others go on.

The receive side needs no task at all: each caller packet is handed to its receive path
in the socket's own datagram callback (``media.rtc.rtp_intake``), and with an inline
engine (echo) the frame it completes is written to the output, and the session woken
here, in that same callback.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from media.pipeline.outbound import OutboundAudio, OutputClosed
from media.rtc.rtp_stream import RtpAudioStream

log = logging.getLogger(__name__)


@dataclass(eq=False)
class TickStream:
    """One session's outgoing audio on the tick: where frames come from, where they go."""

    output: OutboundAudio
    rtp: RtpAudioStream
    due: float = -math.inf  # when its pacer next has something to do
    active: bool = True
    send_failures: int = 0  # frames dropped because the connection was not (yet) up
    woken: bool = False  # waiting to be served on the loop's next turn
    on_ready: Callable[[], None] | None = field(default=None, repr=False)  # its pacer hook
    _seq: int = field(default=-1, repr=False)  # its live timer entry's order (-1: none)


class MediaTick:
    """The sender of every :class:`TickStream` on one event loop."""

    _instances: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MediaTick]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._streams: set[TickStream] = set()
        self._timers: list[tuple[float, int, TickStream]] = []  # (due, order, stream)
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._woken: list[TickStream] = []
        self._drain_scheduled = False
        self.turns = 0  # timer firings and drains: the wake-ups all sessions share

    @classmethod
    def of_running_loop(cls) -> MediaTick:
        loop = asyncio.get_running_loop()
        tick = cls._instances.get(loop)
        if tick is None:
            tick = cls._instances[loop] = cls(loop)
        return tick

    @property
    def streams(self) -> int:
        return len(self._streams)

    def add(self, output: OutboundAudio, rtp: RtpAudioStream) -> TickStream:
        """Send ``output``'s frames on ``rtp`` from now on (a new slot schedule)."""
        stream = TickStream(output, rtp)
        self._streams.add(stream)
        output.restart()
        stream.on_ready = output.pacer.on_ready = lambda: self._wake(stream)
        self._wake(stream)
        return stream

    def remove(self, stream: TickStream) -> None:
        """Stop sending ``stream`` (its output lives on: a resumed session reattaches it)."""
        if not stream.active:
            return
        stream.active = False
        self._streams.discard(stream)
        pacer = stream.output.pacer
        if pacer.on_ready is stream.on_ready:  # not a newer connection's, after a resume
            pacer.on_ready = None

    def _wake(self, stream: TickStream) -> None:
        if stream.woken:
            return
        stream.woken = True
        self._woken.append(stream)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        self.turns += 1
        woken, self._woken = self._woken, []
        for stream in woken:
            stream.woken = False
            if stream.active:
                self._serve(stream)
        self._arm()

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self.turns += 1
        now = self._loop.time()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, seq, stream = heapq.heappop(timers)
            if stream.active and stream._seq == seq:
                stream._seq = -1  # its timer fired: it needs a new one
                self._serve(stream)
        self._arm()

    def _serve(self, stream: TickStream) -> None:
        """Send what ``stream``'s pacer hands out now; note when it next has work."""
        try:
            while (frame := stream.output.poll_frame()) is not None:
                try:
                    stream.rtp.send(frame.payload, frame.pts)
                except ConnectionError:
                    stream.send_failures += 1  # not up yet, or going: the frame's time passes
        except OutputClosed:
            self.remove(stream)
            return
        except Exception:
            log.exception("a session's audio could not be sent; it stops")
            self.remove(stream)
            return
        due = stream.output.pacer.due
        if due != stream.due or stream._seq < 0:
            stream.due = due
            stream._seq = -1
            if due != math.inf:
                stream._seq = next(self._order)
                heapq.heappush(self._timers, (due, stream._seq, stream))

    def _arm(self) -> None:
        """One timer, for the earliest due session."""
        timers = self._timers
        while timers and (not timers[0][2].active or timers[0][2]._seq != timers[0][1]):
            heapq.heappop(timers)  # superseded entries
        at = timers[0][0] if timers else math.inf
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at != math.inf:
            self._timer = self._loop.call_at(at, self._on_timer)
