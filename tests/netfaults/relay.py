"""A userspace UDP relay that sits between two WebRTC peers on loopback and impairs the path.

The kernel these tests run on has no netem, so loss, jitter, reordering and blackouts are
made in the test process itself, on the event loop, without threads.

Every ICE endpoint a peer advertises gets a *stand-in*: a socket of the relay's own. The
SDP each side sends is rewritten so its candidates name the stand-ins, and a datagram from
endpoint X to stand-in(Y) is delivered to Y *from* stand-in(X). So each peer only ever
learns the relay's addresses, every datagram it receives comes from an address it was
told about (no peer-reflexive candidates), and nothing in either direction can bypass the
relay: cutting the relay cuts the call.

    relay = UdpRelay(seed=1)
    call = PeerCall(url, audio, offer_filter=relay.rewrite_offer,
                    answer_filter=relay.rewrite_answer)
    ...connect...
    relay.impair(Impairment(loss=0.05, jitter_ms=30))   # both directions
    relay.impair(Impairment(spike_every_s=4))           # Wi-Fi: 100-300 ms holds
    relay.impair(Impairment(spike_every_s=3, spikes_both_ways=True))  # one stall, both legs
    relay.to_client.impairment = Impairment(loss=0.2)   # or one direction
    relay.blackout(1.5)                                  # both directions; blackout() is forever
    relay.to_server.stats.lost                           # per-direction counters
    relay.forget(Side.CLIENT)                            # that client is gone; a new one may come
    relay.close()

Stand-ins are plain non-blocking sockets watched with ``loop.add_reader``, so making one is
synchronous and an SDP rewrite is a plain ``str -> str`` function. Every random decision
comes from a per-direction ``random.Random`` seeded from the relay's seed.
"""

from __future__ import annotations

import asyncio
import enum
import math
import random
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

Address = tuple[str, int]
Send = Callable[[], object]

MAX_DATAGRAM = 65_535
# Datagrams read per wake-up of one stand-in, so a flood on one cannot starve the loop.
MAX_READS_PER_WAKEUP = 64
# A datagram held back for reordering goes out on its own after this long if no later one
# arrives to overtake it (the sender may have gone quiet).
REORDER_MAX_HOLD_S = 0.05

_CANDIDATE = re.compile(
    r"a=candidate:(?P<foundation>\S+) (?P<component>\d+) (?P<transport>\S+) (?P<priority>\d+)"
    r" (?P<address>\S+) (?P<port>\d+) (?P<rest>typ .*)"
)
_MEDIA = re.compile(r"m=(?P<kind>\S+) (?P<port>\d+) (?P<rest>.*)")
_CONNECTION = re.compile(r"c=IN IP4 (?P<address>\S+)")


class Side(enum.Enum):
    """Which peer an endpoint belongs to: the one that offers, or the one that answers."""

    CLIENT = "client"
    SERVER = "server"


@dataclass(frozen=True)
class Impairment:
    """What one direction does to each datagram.

    ``loss``: probability it is dropped. ``jitter_ms``: extra delay drawn uniformly from
    ``[0, jitter_ms]``, which also reorders datagrams closer together than the spread.
    ``reorder``: probability it is held back and sent right after the next datagram.
    ``burst_loss``: probability that a datagram starts a burst of losses, of
    ``burst_packets`` datagrams (drawn uniformly from the range) counting itself.
    ``spike_every_s``: Wi-Fi-like delay spikes, about this often (each interval drawn from
    half to one and a half times it): the link holds every datagram for ``spike_ms``
    (drawn uniformly from the range), then releases them together, in order.
    ``spikes_both_ways``: (given to both directions with :meth:`UdpRelay.impair`) the two
    directions stall at the same moments for the same time, as a radio link does when it
    stops for a scan or a retrain; otherwise each direction draws its own spikes.
    """

    loss: float = 0.0
    jitter_ms: float = 0.0
    reorder: float = 0.0
    burst_loss: float = 0.0
    burst_packets: tuple[int, int] = (3, 6)
    spike_every_s: float = 0.0
    spike_ms: tuple[float, float] = (100.0, 300.0)
    spikes_both_ways: bool = False

    def __post_init__(self) -> None:
        for name in ("loss", "reorder", "burst_loss"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} is a probability, got {getattr(self, name)}")
        if not 0.0 <= self.jitter_ms < math.inf:
            raise ValueError(f"jitter_ms must be >= 0 and finite, got {self.jitter_ms}")
        if not 0.0 <= self.spike_every_s < math.inf:
            raise ValueError(f"spike_every_s must be >= 0 and finite, got {self.spike_every_s}")
        low, high = self.spike_ms
        if not 0.0 <= low <= high < math.inf:
            raise ValueError(f"spike_ms must be a range of durations, got {self.spike_ms}")
        if not 1 <= self.burst_packets[0] <= self.burst_packets[1]:
            raise ValueError(f"burst_packets must be a range of counts, got {self.burst_packets}")


@dataclass
class LinkStats:
    """Per-direction counts; ``received`` splits into forwarded and the dropped kinds."""

    received: int = 0
    forwarded: int = 0
    lost: int = 0  # dropped by the loss probability (bursts included)
    blacked_out: int = 0  # dropped during a blackout
    send_failed: int = 0  # the kernel refused the datagram (full buffer, closed peer)
    reordered: int = 0  # forwarded, but after a datagram that arrived later
    held: int = 0  # held by a delay spike

    @property
    def dropped(self) -> int:
        return self.lost + self.blacked_out + self.send_failed


class SpikeSchedule:
    """When delay spikes hold a link: one per direction, or one that both directions share."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._next: float | None = None
        self.hold_until = -math.inf  # the current (or last) spike's release
        self.spikes: list[tuple[float, float]] = []  # (start, release) in loop time

    def advance(self, now: float, impairment: Impairment) -> bool:
        """Start the next spike if it is due at ``now``; whether one started."""
        every = impairment.spike_every_s
        if not every:
            self._next = None
            return False
        if self._next is None:
            self._next = now + self._rng.uniform(0.5, 1.5) * every
        if now < self._next or now < self.hold_until:
            return False
        self.hold_until = now + self._rng.uniform(*impairment.spike_ms) / 1000
        self._next = self.hold_until + self._rng.uniform(0.5, 1.5) * every
        self.spikes.append((now, self.hold_until))
        return True


class Link:
    """One direction of the relay: decides each datagram's fate and when it leaves."""

    def __init__(self, name: str, seed: int, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.impairment = Impairment()
        self.stats = LinkStats()
        self._rng = random.Random(f"{seed}:{name}")
        self._loop = loop
        self._blackout_until: float | None = None
        self._held: Send | None = None
        self._held_timer: asyncio.TimerHandle | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self._burst_left = 0
        self.schedule = SpikeSchedule(self._rng)  # the relay may share one between links
        self._spike_seen = -math.inf  # the start of the last spike this link held for
        self._held_in_spike = 0
        self._queued_behind = 0  # datagrams a spike released that are not sent yet
        self._last_release = -math.inf

    @property
    def spikes(self) -> list[tuple[float, float]]:
        """(start, release) of each spike in loop time (shared ones: the same list)."""
        return self.schedule.spikes

    @property
    def blacked_out(self) -> bool:
        return self._blackout_until is not None and self._loop.time() < self._blackout_until

    def blackout(self, seconds: float | None = None) -> None:
        """Drop every datagram from now on, for ``seconds`` or (``None``) until restored.

        Datagrams already in flight (delayed by jitter, held for reordering) still arrive,
        as they would on a real link that fails behind them.
        """
        self._blackout_until = math.inf if seconds is None else self._loop.time() + seconds

    def restore(self) -> None:
        self._blackout_until = None

    def submit(self, send: Send) -> None:
        """Take one datagram, as the callable that sends it on, and apply the impairment."""
        self.stats.received += 1
        if self.blacked_out:
            self.stats.blacked_out += 1
            return
        impairment, rng = self.impairment, self._rng
        if self._burst_left:
            self._burst_left -= 1
            self.stats.lost += 1
            return
        if impairment.burst_loss and rng.random() < impairment.burst_loss:
            self._burst_left = rng.randint(*impairment.burst_packets) - 1
            self.stats.lost += 1
            return
        if impairment.loss and rng.random() < impairment.loss:
            self.stats.lost += 1
            return
        delay = rng.uniform(0.0, impairment.jitter_ms / 1000) if impairment.jitter_ms else 0.0
        now = self._loop.time()
        release = self._spike_release(now)
        if release is not None:
            self._schedule_held(max(now + delay, release), send)
            return
        if self._held is None and impairment.reorder and rng.random() < impairment.reorder:
            self._held = send
            self._held_timer = self._loop.call_later(REORDER_MAX_HOLD_S, self._release_held)
            return
        if self._held is None:
            self._schedule(delay, send)
            return
        held, self._held = self._held, None
        self._cancel_held_timer()
        self.stats.reordered += 1
        self._schedule(delay, send, held)

    def _spike_release(self, now: float) -> float | None:
        """When a delay spike releases a datagram that comes now (None: no spike now).

        Datagrams held by one spike leave together at its release, 10 us apart in the
        order they came, and nothing that comes after overtakes them, however late the
        loop runs their timers.
        """
        schedule = self.schedule
        schedule.advance(now, self.impairment)
        if schedule.spikes and schedule.spikes[-1][0] != self._spike_seen:
            self._spike_seen = schedule.spikes[-1][0]
            self._held_in_spike = 0
        if now < schedule.hold_until:
            self.stats.held += 1
            self._held_in_spike += 1
            release = schedule.hold_until + 1e-5 * self._held_in_spike
        elif self._queued_behind:  # released ones the loop has not sent yet: queue behind
            release = self._last_release + 1e-5
        else:
            return None
        self._last_release = max(self._last_release, release)
        return release

    def _schedule_held(self, at: float, send: Send) -> None:
        timer: asyncio.TimerHandle
        self._queued_behind += 1

        def fire() -> None:
            self._timers.discard(timer)
            self._queued_behind -= 1
            self._deliver(send)

        timer = self._loop.call_at(at, fire)
        self._timers.add(timer)

    def close(self) -> None:
        """Cancel everything still in flight."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._cancel_held_timer()
        self._held = None

    def _release_held(self) -> None:
        self._held_timer = None
        held, self._held = self._held, None
        assert held is not None  # the timer is cancelled whenever the held datagram leaves
        self._deliver(held)

    def _cancel_held_timer(self) -> None:
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None

    def _schedule(self, delay: float, *sends: Send) -> None:
        """Send ``sends`` in this order after ``delay`` (one timer keeps the order exact)."""
        if delay <= 0.0:
            self._deliver(*sends)
            return
        timer: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(timer)
            self._deliver(*sends)

        timer = self._loop.call_later(delay, fire)
        self._timers.add(timer)

    def _deliver(self, *sends: Send) -> None:
        for send in sends:
            try:
                send()
            except OSError:
                self.stats.send_failed += 1
            else:
                self.stats.forwarded += 1


def share_spikes(impairment: Impairment, *links: Link) -> None:
    """Impair ``links`` alike; with ``spikes_both_ways``, on one spike schedule (the first's)."""
    for link in links:
        link.impairment = impairment
        if impairment.spikes_both_ways:
            link.schedule = links[0].schedule


@dataclass(eq=False)
class _StandIn:
    side: Side
    real: Address
    sock: socket.socket

    @property
    def address(self) -> Address:
        host, port = self.sock.getsockname()[:2]
        return host, port


class UdpRelay:
    """Carries every datagram between a client and a server, through seeded impairments.

    Make it inside a running event loop; use it as a context manager (or call
    :meth:`close`) so its sockets and timers go away with the test.
    """

    def __init__(self, *, seed: int = 0, host: str = "127.0.0.1") -> None:
        self._loop = asyncio.get_running_loop()
        self._host = host
        self.to_server = Link("to_server", seed, self._loop)
        self.to_client = Link("to_client", seed, self._loop)
        self._stand_ins: dict[Address, _StandIn] = {}
        self.unknown_source = 0  # datagrams from an address that is no endpoint (dropped)

    def __enter__(self) -> UdpRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def links(self) -> tuple[Link, Link]:
        return self.to_server, self.to_client

    def impair(self, impairment: Impairment) -> None:
        """Apply ``impairment`` to both directions (set ``link.impairment`` for one)."""
        share_spikes(impairment, *self.links)

    def blackout(self, seconds: float | None = None) -> None:
        """Cut both directions for ``seconds``, or until :meth:`restore` when ``None``."""
        for link in self.links:
            link.blackout(seconds)

    def restore(self) -> None:
        for link in self.links:
            link.restore()

    def rewrite_offer(self, sdp: str) -> str:
        """The client's SDP with its candidates replaced by stand-ins."""
        return self._rewrite(sdp, Side.CLIENT)

    def rewrite_answer(self, sdp: str) -> str:
        """The server's SDP with its candidates replaced by stand-ins."""
        return self._rewrite(sdp, Side.SERVER)

    def stand_in(self, side: Side, real: Address) -> Address:
        """The relay's address for endpoint ``real`` of ``side`` (made on first use)."""
        existing = self._stand_ins.get(real)
        if existing is not None:
            if existing.side is not side:
                raise ValueError(f"{real} is already a {existing.side.value} endpoint")
            return existing.address
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind((self._host, 0))
        entry = _StandIn(side, real, sock)
        self._stand_ins[real] = entry
        self._loop.add_reader(sock.fileno(), self._on_readable, entry)
        return entry.address

    def endpoints(self, side: Side) -> list[Address]:
        """The real addresses of ``side`` that the relay carries traffic for."""
        return [entry.real for entry in self._stand_ins.values() if entry.side is side]

    def forget(self, side: Side) -> None:
        """Drop ``side``'s endpoints: that peer is gone, whatever it still sends or is sent.

        Its stand-ins close, so datagrams to them vanish in the kernel and datagrams from its
        old addresses count as ``unknown_source``. A new peer connection of the same side
        gets new stand-ins when its SDP is rewritten.
        """
        self._close_stand_ins(entry for entry in self._stand_ins.values() if entry.side is side)

    def close(self) -> None:
        self._close_stand_ins(list(self._stand_ins.values()))
        for link in self.links:
            link.close()

    def _close_stand_ins(self, entries: Iterable[_StandIn]) -> None:
        for entry in list(entries):
            del self._stand_ins[entry.real]
            self._loop.remove_reader(entry.sock.fileno())
            entry.sock.close()

    def _on_readable(self, target: _StandIn) -> None:
        """Datagrams for ``target.real`` arrived at its stand-in; pass each one on."""
        for _ in range(MAX_READS_PER_WAKEUP):
            try:
                data, source = target.sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                return
            origin = self._stand_ins.get(source[:2])
            if origin is None:
                self.unknown_source += 1
                continue
            link = self.to_server if origin.side is Side.CLIENT else self.to_client
            link.submit(partial(origin.sock.sendto, data, target.real))

    def _rewrite(self, sdp: str, side: Side) -> str:
        sections: list[list[str]] = [[]]
        for line in sdp.splitlines():
            if line.startswith("m="):
                sections.append([])
            sections[-1].append(line)
        lines = [line for section in sections for line in self._rewrite_section(section, side)]
        return "\r\n".join(lines) + "\r\n"

    def _rewrite_section(self, lines: list[str], side: Side) -> list[str]:
        """One SDP section with its UDP candidates on stand-ins and other candidates removed.

        The ``m=`` port and ``c=`` address name the section's default candidate; when that
        is one of the rewritten ones they follow it, so no real address is left to use.
        """
        out: list[str] = []
        moved: dict[Address, Address] = {}
        for line in lines:
            match = _CANDIDATE.fullmatch(line)
            if match is None:
                out.append(line)
                continue
            if match["transport"].lower() != "udp":
                continue  # the relay carries UDP only: a TCP candidate would bypass it
            real = (match["address"], int(match["port"]))
            host, port = moved[real] = self.stand_in(side, real)
            out.append(
                f"a=candidate:{match['foundation']} {match['component']} {match['transport']}"
                f" {match['priority']} {host} {port} {match['rest']}"
            )
        media = _MEDIA.fullmatch(out[0]) if out else None
        connections = [(i, c) for i, line in enumerate(out) if (c := _CONNECTION.fullmatch(line))]
        if media is None or not connections:
            return out
        index, connection = connections[0]
        default = (connection["address"], int(media["port"]))
        if default in moved:
            host, port = moved[default]
            out[0] = f"m={media['kind']} {port} {media['rest']}"
            out[index] = f"c=IN IP4 {host}"
        return out
