"""The test relay itself: where datagrams go, what each impairment does, how SDP is rewritten.

The fault tests trust the relay's counters and its claim that nothing bypasses it; these
checks are what earn that trust.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.netfaults.relay import (
    REORDER_MAX_HOLD_S,
    Address,
    Impairment,
    Link,
    Side,
    UdpRelay,
    share_spikes,
)

LOOPBACK = "127.0.0.1"


class Endpoint(asyncio.DatagramProtocol):
    """A UDP socket on loopback that queues what it receives with the sender's address."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[tuple[bytes, Address]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.put_nowait((data, addr[:2]))

    @property
    def address(self) -> Address:
        assert self.transport is not None
        host, port = self.transport.get_extra_info("sockname")[:2]
        return host, port

    def send(self, data: bytes, to: Address) -> None:
        assert self.transport is not None
        self.transport.sendto(data, to)

    async def next(self) -> tuple[bytes, Address]:
        async with asyncio.timeout(2.0):
            return await self.received.get()


async def endpoint() -> Endpoint:
    transport, protocol = await asyncio.get_running_loop().create_datagram_endpoint(
        Endpoint, local_addr=(LOOPBACK, 0)
    )
    protocol.transport = transport
    return protocol


def link(seed: int = 1, **impairment: Any) -> tuple[Link, list[int]]:
    """A link whose "datagrams" are indices appended to the returned list when sent."""
    one = Link("test", seed, asyncio.get_running_loop())
    one.impairment = Impairment(**impairment)
    return one, []


def submit(one: Link, delivered: list[int], count: int) -> None:
    for index in range(count):
        one.submit(lambda index=index: delivered.append(index))


async def test_loss_drops_about_the_given_share_the_same_way_for_the_same_seed():
    first, delivered = link(seed=7, loss=0.1)
    submit(first, delivered, 2000)
    again, redelivered = link(seed=7, loss=0.1)
    submit(again, redelivered, 2000)
    other, other_delivered = link(seed=8, loss=0.1)
    submit(other, other_delivered, 2000)

    assert first.stats.received == 2000
    assert first.stats.forwarded + first.stats.lost == 2000
    assert 120 <= first.stats.lost <= 280  # binomial mean 200, sd 13
    assert delivered == redelivered
    assert delivered != other_delivered


async def test_jitter_delays_within_its_bound_and_reorders():
    one, delivered = link(jitter_ms=20.0)
    loop = asyncio.get_running_loop()
    all_delivered = asyncio.Event()

    def deliver(index: int) -> None:
        delivered.append(index)
        if len(delivered) == 50:
            all_delivered.set()

    started = loop.time()
    for index in range(50):
        one.submit(lambda index=index: deliver(index))
    assert delivered == []  # every datagram waits some random part of 20 ms
    async with asyncio.timeout(1.0):
        await all_delivered.wait()
    assert loop.time() - started < 0.5
    assert sorted(delivered) == list(range(50))
    assert delivered != sorted(delivered)


async def test_reorder_sends_a_held_datagram_right_after_the_next_one():
    one, delivered = link(reorder=1.0)
    submit(one, delivered, 6)
    assert delivered == [1, 0, 3, 2, 5, 4]
    assert one.stats.reordered == 3


async def test_a_held_datagram_goes_alone_when_nothing_overtakes_it():
    one, delivered = link(reorder=1.0)
    submit(one, delivered, 1)
    assert delivered == []
    await asyncio.sleep(REORDER_MAX_HOLD_S * 2)
    assert delivered == [0]
    assert one.stats.reordered == 0


async def test_timed_blackout_drops_everything_then_lifts_by_itself():
    one, delivered = link()
    one.blackout(0.05)
    submit(one, delivered, 5)
    assert one.blacked_out
    await asyncio.sleep(0.06)
    assert not one.blacked_out
    one.submit(lambda: delivered.append(99))
    assert delivered == [99]
    assert one.stats.blacked_out == 5
    assert one.stats.dropped == 5


async def test_blackout_without_duration_lasts_until_restored():
    one, delivered = link()
    one.blackout()
    await asyncio.sleep(0.02)
    submit(one, delivered, 3)
    one.restore()
    submit(one, delivered, 2)
    assert delivered == [0, 1]
    assert one.stats.blacked_out == 3


async def test_a_send_the_kernel_refuses_is_counted_not_raised():
    one, _ = link()

    def refused() -> None:
        raise BlockingIOError

    one.submit(refused)
    assert one.stats.send_failed == 1
    assert one.stats.forwarded == 0


async def test_burst_loss_drops_runs_of_the_given_length():
    one, delivered = link(seed=3, burst_loss=0.02, burst_packets=(3, 5))
    submit(one, delivered, 3000)
    kept = set(delivered)
    runs, run = [], 0
    for index in range(3000):
        if index in kept:
            if run:
                runs.append(run)
            run = 0
        else:
            run += 1
    assert runs and all(3 <= r <= 10 for r in runs)  # two bursts may touch
    assert 0.04 <= one.stats.lost / 3000 <= 0.12
    assert one.stats.lost == 3000 - len(delivered)


async def test_a_delay_spike_holds_everything_then_releases_it_together_in_order():
    """Wi-Fi-like: every datagram of ~150 ms is held, then all of them leave at once."""
    one, _ = link(seed=2, spike_every_s=0.1, spike_ms=(150.0, 150.0))
    loop = asyncio.get_running_loop()
    arrived: dict[int, float] = {}
    started = loop.time()
    for index in range(40):  # one every 10 ms for 0.4 s
        one.submit(lambda index=index: arrived.setdefault(index, loop.time()))
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert sorted(arrived) == list(range(40))
    assert list(arrived) == sorted(arrived), "a spike reordered what it held"
    assert one.spikes, "no spike came"
    spike_start, release = one.spikes[0]
    assert release - spike_start == pytest.approx(0.15)
    held = [i for i, at in arrived.items() if at >= release - 0.001 and at < release + 0.01]
    assert len(held) >= 10 and one.stats.held >= 10
    assert spike_start - started <= 0.16


async def test_spikes_both_ways_stall_both_directions_at_the_same_moments():
    """A radio stall holds both legs at once; without the flag each leg draws its own."""
    loop = asyncio.get_running_loop()
    spiky = {"spike_every_s": 0.15, "spike_ms": (60.0, 90.0)}
    shared_up, shared_down = Link("up", 3, loop), Link("down", 3, loop)
    share_spikes(Impairment(**spiky, spikes_both_ways=True), shared_up, shared_down)
    own_up, own_down = Link("up", 3, loop), Link("down", 3, loop)
    share_spikes(Impairment(**spiky), own_up, own_down)
    links = (shared_up, shared_down, own_up, own_down)
    for _ in range(80):  # one datagram each way every 10 ms for 0.8 s
        for one in links:
            one.submit(lambda: None)
        await asyncio.sleep(0.01)
    for one in links:
        one.close()
    assert len(shared_up.spikes) >= 3
    assert shared_up.spikes == shared_down.spikes
    assert shared_up.stats.held > 0 and shared_down.stats.held > 0
    assert abs(shared_up.stats.held - shared_down.stats.held) <= len(shared_up.spikes)
    assert own_up.spikes and own_down.spikes and own_up.spikes != own_down.spikes


@pytest.mark.parametrize(
    "impairment",
    [
        {"loss": 1.5},
        {"reorder": -0.1},
        {"jitter_ms": -1.0},
        {"jitter_ms": 1e999},
        {"burst_loss": 2.0},
        {"spike_ms": (300.0, 100.0)},
        {"burst_packets": (0, 3)},
    ],
)
def test_impairment_refuses_values_that_mean_nothing(impairment: dict[str, Any]):
    with pytest.raises(ValueError):
        Impairment(**impairment)


async def test_each_side_sees_only_stand_ins_and_each_direction_is_counted():
    """A datagram from X to stand-in(Y) reaches Y from stand-in(X), both ways."""
    client, server = await endpoint(), await endpoint()
    with UdpRelay(seed=1) as relay:
        server_seen_as = relay.stand_in(Side.SERVER, server.address)
        client_seen_as = relay.stand_in(Side.CLIENT, client.address)

        client.send(b"ping", server_seen_as)
        assert await server.next() == (b"ping", client_seen_as)
        server.send(b"pong", client_seen_as)
        assert await client.next() == (b"pong", server_seen_as)

        assert relay.to_server.stats.forwarded == 1
        assert relay.to_client.stats.forwarded == 1
        assert relay.stand_in(Side.SERVER, server.address) == server_seen_as
        with pytest.raises(ValueError):
            relay.stand_in(Side.CLIENT, server.address)
    for one in (client, server):
        assert one.transport is not None
        one.transport.close()


async def test_datagrams_from_unknown_or_forgotten_addresses_are_dropped():
    """A stranger gets nothing through; a forgotten client is gone, a new one gets through."""
    old, new, stranger, server = [await endpoint() for _ in range(4)]
    with UdpRelay() as relay:
        server_seen_as = relay.stand_in(Side.SERVER, server.address)
        relay.stand_in(Side.CLIENT, old.address)
        stranger.send(b"stranger", server_seen_as)
        old.send(b"old", server_seen_as)
        assert (await server.next())[0] == b"old"  # the stranger's went first, and nowhere
        assert relay.unknown_source == 1

        relay.forget(Side.CLIENT)
        assert relay.endpoints(Side.CLIENT) == []
        new_seen_as = relay.stand_in(Side.CLIENT, new.address)
        old.send(b"old again", server_seen_as)
        new.send(b"new", server_seen_as)
        assert await server.next() == (b"new", new_seen_as)
        assert relay.unknown_source == 2
        assert server.received.empty()
    for one in (old, new, stranger, server):
        assert one.transport is not None
        one.transport.close()


OFFER = (
    "v=0\r\n"
    "o=- 1 1 IN IP4 0.0.0.0\r\n"
    "s=-\r\n"
    "t=0 0\r\n"
    "a=group:BUNDLE 0 1\r\n"
    "m=audio 44298 UDP/TLS/RTP/SAVPF 96\r\n"
    "c=IN IP4 127.0.0.1\r\n"
    "a=mid:0\r\n"
    "a=candidate:abc 1 udp 2130706431 127.0.0.1 44298 typ host\r\n"
    "a=candidate:def 1 tcp 1518280447 127.0.0.1 9 typ host tcptype active\r\n"
    "a=end-of-candidates\r\n"
    "m=application 58847 UDP/DTLS/SCTP webrtc-datachannel\r\n"
    "c=IN IP4 127.0.0.1\r\n"
    "a=mid:1\r\n"
    "a=candidate:abc 1 udp 2130706431 127.0.0.1 58847 typ host\r\n"
    "a=end-of-candidates\r\n"
)


async def test_sdp_rewrite_leaves_no_real_address_to_reach():
    with UdpRelay() as relay:
        rewritten = relay.rewrite_offer(OFFER)
        audio, data = (relay.stand_in(Side.CLIENT, (LOOPBACK, port)) for port in (44298, 58847))
    assert relay.endpoints(Side.CLIENT) == []  # closed with the relay
    assert rewritten.endswith("\r\n")
    lines = rewritten.split("\r\n")
    assert f"a=candidate:abc 1 udp 2130706431 {audio[0]} {audio[1]} typ host" in lines
    assert f"a=candidate:abc 1 udp 2130706431 {data[0]} {data[1]} typ host" in lines
    assert f"m=audio {audio[1]} UDP/TLS/RTP/SAVPF 96" in lines
    assert f"m=application {data[1]} UDP/DTLS/SCTP webrtc-datachannel" in lines
    assert not any(" tcp " in line for line in lines), "a TCP candidate would bypass the relay"
    assert not re.search(r"\b(44298|58847)\b", rewritten)
    assert rewritten.count("a=end-of-candidates") == 2
