"""Every adaptation of aiortc and aioice internals, each checked against the pinned versions.

Neither library offers public hooks for these. Each adaptation is an explicit function
(never an import-time side effect) that can be undone, and :func:`check_versions` refuses
to apply them to a version they were not checked against, so an upgrade is a conscious
change: re-check each entry below, then move the pins here and in pyproject.toml.

DTLS cipher suites (:func:`accept_rsa_dtls_peers`)
    aiortc 1.16.0 offers only ECDHE-ECDSA suites (``RTCCertificate._create_ssl_context``),
    so a peer with an RSA certificate has no suite in common with it: GStreamer's webrtcbin
    (and so ``whipsink``/``simple-whip-client``) fails with "no shared cipher" as the DTLS
    server (aiortc issues #1392, #1434). This sets a list that also holds the ECDHE-RSA
    AEAD suites. Nothing weaker is added: every suite keeps forward secrecy (ECDHE), the
    only CBC suites are the two ECDHE-ECDSA ones aiortc already had, and the list stays
    short, so the ClientHello is not fragmented (aiortc #956: OBS's Mbed TLS cannot
    reassemble a fragmented one). The suite that decides is the one whose signature matches
    the DTLS server's certificate, so ECDSA peers (browsers) still negotiate
    ECDHE-ECDSA-AES128-GCM-SHA256, RFC 8827's mandatory suite, first.
    Remove when aiortc's own list accepts RSA certificates (pull request #1421 or similar).

The receive path (:func:`install_receive_path`)
    aiortc's audio receiver holds four packets in a fixed jitter buffer, stalls on loss and
    decodes in a thread with no concealment (``media.rtc.receive`` says what replaces it).
    The receiver's private ``__jitter_buffer`` attribute is replaced by our path, whose
    ``add`` has the same signature; the stock decoder thread then stays idle.
    Remove if aiortc grows a way to take RTP packets from a receiver.

Sent packets kept after close (:func:`forget_sent_packets`)
    Each ``RTCRtpSender`` keeps its last 128 RTP packets (``__rtp_history``) to answer
    NACKs, and a closed peer connection is a tangle of reference cycles that only the
    cyclic garbage collector frees. Until a full collection runs, every closed session
    kept those packets (about half of its garbage by object count): with two sessions
    closing a second, tens of thousands of them, a heap that swelled by 20-40 MB between
    collections and stayed fragmented after. The history is dropped once the connection
    is closed, when no retransmission can be asked for.
    Remove if aiortc clears it in ``RTCRtpSender.stop``.

The send path (:func:`when_sender_starts`, :func:`sender_ssrc`, :func:`sent_report`,
:func:`protected_rtp_send`)
    aiortc runs a coroutine per sender that pulls each frame from its track and awaits its
    way down to the socket; ``media.rtc.media_tick`` sends every session's frames from one
    task instead. It needs the negotiated parameters when the sender starts (the sender's
    ``send`` is wrapped on the instance), the sender's SSRC (``_ssrc``), the counters its
    RTCP sender reports read (``__packet_count``, ``__octet_count``, ``__rtp_timestamp``,
    ``__ntp_timestamp``), and a synchronous SRTP send: the DTLS transport's ``_tx_srtp``
    and its ``_state`` (the ``state`` property formats the enum on every read), the SRTP
    session's libsrtp handle (``media.rtc.srtp``), and the ICE connection's nominated pair
    (``_connection._nominated``), whose socket aioice's ``send_data`` writes to without
    awaiting anything. The DTLS transport's own send counters (``__tx_packets``,
    ``__tx_bytes``, in its ``transport`` stats) are kept.
    Remove if aiortc lets a sender take encoded frames from a caller that paces them.

Audio packets from the socket (:func:`when_receiver_starts`, :func:`received_report`,
:func:`divert_rtp`)
    aiortc queues every datagram for a coroutine per DTLS transport, which wakes for it,
    unprotects and parses it and awaits its way into the receiver; ``media.rtc.rtp_intake``
    takes the audio packets in aioice's datagram callback instead. It needs the negotiated
    parameters when the receiver starts (after DTLS is up: the receiver's ``receive`` is
    wrapped on the instance), the receiver's statistics and active sources
    (``__remote_streams``, ``__active_ssrc``, ``__codecs``: what its RTCP receiver reports,
    ``getStats`` and ``getSynchronizationSources`` read) and its ``_enabled`` flag, the DTLS
    transport's ``_rx_srtp`` session and receive counters (``__rx_packets``,
    ``__rx_bytes``), and the ICE connection's ``data_received``, which aioice's protocols
    call for every datagram that is not STUN; it is replaced on the connection instance,
    and each host protocol's ``datagram_received`` (``_connection._protocols``) hands it
    RTP and RTCP without first trying them as STUN (a raised ``ValueError`` per packet).
    Everything else (DTLS, RTCP, other payload types) still goes aiortc's way.
    Remove if aiortc lets a receiver hand RTP packets to a caller as they arrive.

Host candidates (:func:`restrict_host_addresses`, :func:`bind_host_ports`,
:func:`announce_host_address`)
    aioice gathers on every address but 127.0.0.1, binds port 0, and signals the bound
    address. These replace ``aioice.ice.get_host_addresses``, ``Connection.
    get_component_candidates`` and ``Connection.local_candidates`` with the versions built
    in ``media.rtc.ice``. Passing ``[]``/None restores aioice's own.
    Remove if aioice takes the address list, a port range and an announced address as
    options.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import aioice
import aioice.ice
import aiortc
import pylibsrtp
from aiortc import clock
from aiortc.rtcdtlstransport import RTCCertificate
from aiortc.rtcdtlstransport import State as DtlsState
from aiortc.rtcrtpparameters import RTCRtpReceiveParameters, RTCRtpSendParameters
from aiortc.rtcrtpreceiver import StreamStatistics
from OpenSSL import SSL

from media.rtc import ice
from media.rtc.srtp import Transform, packet_cipher

CHECKED_AIORTC_VERSION = "1.16.0"
CHECKED_AIOICE_VERSION = "0.13.0"

DTLS_CIPHER_SUITES = (
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    # CBC, as aiortc already offers them: for old ECDSA peers only.
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
)
RECEIVER_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"
SENDER_HISTORY = "_RTCRtpSender__rtp_history"
SENDER_PACKET_COUNT = "_RTCRtpSender__packet_count"
SENDER_OCTET_COUNT = "_RTCRtpSender__octet_count"
SENDER_RTP_TIMESTAMP = "_RTCRtpSender__rtp_timestamp"
SENDER_NTP_TIMESTAMP = "_RTCRtpSender__ntp_timestamp"
RECEIVER_REMOTE_STREAMS = "_RTCRtpReceiver__remote_streams"
RECEIVER_ACTIVE_SOURCES = "_RTCRtpReceiver__active_ssrc"
RECEIVER_CODECS = "_RTCRtpReceiver__codecs"
DTLS_COUNTERS = {
    "rx_packets": "_RTCDtlsTransport__rx_packets",
    "rx_bytes": "_RTCDtlsTransport__rx_bytes",
    "tx_packets": "_RTCDtlsTransport__tx_packets",
    "tx_bytes": "_RTCDtlsTransport__tx_bytes",
}
RTCP_PACKET_TYPES = range(192, 224)  # the second byte of an RTCP packet (RFC 5761 section 4)

_stock_create_ssl_context: Callable[..., SSL.Context] = RTCCertificate._create_ssl_context
_stock_get_host_addresses = aioice.ice.get_host_addresses
_stock_get_component_candidates = aioice.ice.Connection.get_component_candidates
_stock_local_candidates: property = aioice.ice.Connection.local_candidates  # type: ignore[assignment]


class UncheckedVersion(RuntimeError):
    """The installed aiortc or aioice is not the one these adaptations were checked against."""


def check_versions() -> None:
    """Refuse to run the adaptations on a library version they were not written for."""
    for library, checked in ((aiortc, CHECKED_AIORTC_VERSION), (aioice, CHECKED_AIOICE_VERSION)):
        if library.__version__ != checked:
            raise UncheckedVersion(
                f"{library.__name__} {library.__version__} is installed; media.rtc.compat was "
                f"checked against {checked}: re-check each adaptation, then update the pin"
            )


# --- DTLS ----------------------------------------------------------------------------------


def accept_rsa_dtls_peers() -> None:
    """Offer ECDHE-RSA suites next to aiortc's ECDHE-ECDSA ones (idempotent)."""
    check_versions()
    cipher_list = ":".join(DTLS_CIPHER_SUITES).encode()

    def create_ssl_context(self: RTCCertificate, *args: Any, **kwargs: Any) -> SSL.Context:
        context = _stock_create_ssl_context(self, *args, **kwargs)
        context.set_cipher_list(cipher_list)
        return context

    RTCCertificate._create_ssl_context = create_ssl_context  # type: ignore[method-assign]


def restore_dtls_ciphers() -> None:
    """aiortc's own cipher list again."""
    RTCCertificate._create_ssl_context = _stock_create_ssl_context  # type: ignore[method-assign]


# --- the receive path ----------------------------------------------------------------------


def install_receive_path(receiver: Any, path: Any) -> None:
    """Route an aiortc ``RTCRtpReceiver``'s audio packets into ``path`` (``add(packet)``)."""
    check_versions()
    if not hasattr(receiver, RECEIVER_JITTER_BUFFER):
        raise UncheckedVersion("this aiortc's receiver has no jitter buffer to replace")
    setattr(receiver, RECEIVER_JITTER_BUFFER, path)


def forget_sent_packets(pc: aiortc.RTCPeerConnection) -> None:
    """Drop the retransmission history of every sender of the closed connection ``pc``."""
    check_versions()
    for sender in pc.getSenders():
        history = getattr(sender, SENDER_HISTORY, None)
        if history is None:
            raise UncheckedVersion("this aiortc's sender keeps no packet history to drop")
        history.clear()


# --- host candidates -----------------------------------------------------------------------


def restrict_host_addresses(addresses: Sequence[str]) -> None:
    """Gather host candidates only on ``addresses`` (empty: aioice's default behaviour)."""
    if not addresses:
        aioice.ice.get_host_addresses = _stock_get_host_addresses
        return
    check_versions()
    aioice.ice.get_host_addresses = ice.address_lookup(addresses)  # type: ignore[assignment]


def bind_host_ports(port_range: tuple[int, int] | None) -> None:
    """Bind every host candidate to a UDP port in ``port_range`` (None: any port)."""
    if port_range is None:
        aioice.ice.Connection.get_component_candidates = _stock_get_component_candidates  # type: ignore[method-assign]
        return
    check_versions()
    low, high = port_range
    gatherer = ice.gatherer_in_range(low, high, _stock_get_component_candidates)
    aioice.ice.Connection.get_component_candidates = gatherer  # type: ignore[method-assign,assignment]


def announce_host_address(address: str | None) -> None:
    """Signal ``address`` instead of the bound one in host candidates of its family (None:
    the bound address, aioice's way)."""
    if address is None:
        aioice.ice.Connection.local_candidates = _stock_local_candidates  # type: ignore[method-assign,assignment]
        return
    check_versions()
    announced = ice.announced_local_candidates(address, _stock_local_candidates)
    aioice.ice.Connection.local_candidates = announced  # type: ignore[method-assign,assignment]


# --- the send path -------------------------------------------------------------------------


def when_sender_starts(
    sender: aiortc.RTCRtpSender, started: Callable[[RTCRtpSendParameters], None]
) -> None:
    """Call ``started`` with the negotiated parameters once ``sender`` starts sending."""
    check_versions()
    _tell_first_call(sender, "send", started)


def _tell_first_call(instance: Any, method: str, started: Callable[[Any], None]) -> None:
    """Wrap ``instance.method`` (an async method taking the negotiated parameters) so that
    ``started`` hears of its first call, once it returned. Only once: aiortc calls a
    sender's ``send`` and a receiver's ``receive`` again on every (re)connect, as no-ops."""
    stock = getattr(instance, method)

    async def first_call(parameters: Any) -> None:
        await stock(parameters)
        setattr(instance, method, stock)
        started(parameters)

    setattr(instance, method, first_call)


def sender_ssrc(sender: aiortc.RTCRtpSender) -> int:
    check_versions()
    return int(sender._ssrc)


def sent_report(sender: aiortc.RTCRtpSender) -> Callable[[int, int, int, int], None]:
    """What keeps ``sender``'s RTCP sender reports true for packets sent around it:
    ``(packets, octets, rtp_timestamp, ntp_timestamp)`` after each packet."""
    check_versions()
    if not hasattr(sender, SENDER_PACKET_COUNT):
        raise UncheckedVersion("this aiortc's sender keeps no packet count to report")

    def report(packets: int, octets: int, rtp_timestamp: int, ntp_timestamp: int) -> None:
        setattr(sender, SENDER_PACKET_COUNT, packets)
        setattr(sender, SENDER_OCTET_COUNT, octets)
        setattr(sender, SENDER_RTP_TIMESTAMP, rtp_timestamp)
        setattr(sender, SENDER_NTP_TIMESTAMP, ntp_timestamp)

    return report


def protected_rtp_send(dtls: aiortc.RTCDtlsTransport) -> Callable[[bytes], None]:
    """Send an RTP packet on ``dtls`` at once: SRTP-protect it and write it to the nominated
    ICE pair's socket (aiortc's ``_send_rtp``, without its three awaits).

    Raises ``ConnectionError`` when DTLS is not connected or ICE has no nominated pair.
    """
    check_versions()
    ice_connection = dtls.transport._connection
    count = _dtls_counter(dtls, "tx")
    # DTLS makes its SRTP session once it is connected: its protect is made on first use.
    protected_by: pylibsrtp.Session | None = None
    protect: Transform | None = None

    def send(packet: bytes) -> None:
        if dtls._state is not DtlsState.CONNECTED:  # ``state`` formats the enum each time
            raise ConnectionError("DTLS is not connected")
        pair = ice_connection._nominated.get(1)
        if pair is None or pair.protocol.transport is None:
            raise ConnectionError("ICE has no nominated pair")
        nonlocal protected_by, protect
        if dtls._tx_srtp is not protected_by or protect is None:
            protected_by = dtls._tx_srtp
            protect = packet_cipher(protected_by)[0]
        data = protect(packet)
        pair.protocol.transport.sendto(data, pair.remote_addr)
        count(len(data))

    return send


def _dtls_counter(dtls: aiortc.RTCDtlsTransport, direction: str) -> Callable[[int], None]:
    """What counts a datagram of ``size`` bytes sent (``tx``) or received (``rx``) around
    ``dtls`` in its own ``transport`` stats."""
    packets, octets = DTLS_COUNTERS[f"{direction}_packets"], DTLS_COUNTERS[f"{direction}_bytes"]
    counters = vars(dtls)  # the transport's own attributes, updated in place
    if packets not in counters or octets not in counters:
        raise UncheckedVersion("this aiortc's DTLS transport keeps no packet counters")

    def count(size: int) -> None:
        counters[packets] += 1
        counters[octets] += size

    return count


# --- audio packets from the socket ---------------------------------------------------------


def when_receiver_starts(
    receiver: aiortc.RTCRtpReceiver, started: Callable[[RTCRtpReceiveParameters], None]
) -> None:
    """Call ``started`` with the negotiated parameters once ``receiver`` starts (DTLS is up)."""
    check_versions()
    _tell_first_call(receiver, "receive", started)


def received_report(receiver: aiortc.RTCRtpReceiver) -> Callable[[Any], None]:
    """What keeps ``receiver``'s statistics true for a packet taken around it (one with
    ``RtpPacket``'s ``ssrc``, ``payload_type``, ``sequence_number`` and ``timestamp``): its
    RTCP receiver reports, ``getStats`` and ``getSynchronizationSources`` read them."""
    check_versions()
    if not hasattr(receiver, RECEIVER_REMOTE_STREAMS):
        raise UncheckedVersion("this aiortc's receiver keeps no stream statistics")
    streams: dict[int, StreamStatistics] = getattr(receiver, RECEIVER_REMOTE_STREAMS)
    sources: dict[int, Any] = getattr(receiver, RECEIVER_ACTIVE_SOURCES)
    codecs: dict[int, Any] = getattr(receiver, RECEIVER_CODECS)

    def report(packet: Any) -> None:
        sources[packet.ssrc] = clock.current_datetime()
        stream = streams.get(packet.ssrc)
        if stream is None:
            stream = streams[packet.ssrc] = StreamStatistics(codecs[packet.payload_type].clockRate)
        stream.add(packet)

    return report


def divert_rtp(
    receiver: aiortc.RTCRtpReceiver,
    payload_types: Collection[int],
    take: Callable[[bytes], None],
) -> None:
    """From now on hand every SRTP packet of ``payload_types`` that reaches ``receiver``'s
    transport to ``take``, unprotected, in aioice's datagram callback; the rest (DTLS, RTCP,
    other payload types) still goes through aiortc's queue. Call once the receiver started.

    A packet that fails SRTP authentication (or replays one) is dropped, as aiortc drops it.
    """
    check_versions()
    dtls = receiver.transport
    session = dtls._rx_srtp
    if session is None:
        raise ConnectionError("DTLS is not connected")
    unprotect = packet_cipher(session)[1]
    count = _dtls_counter(dtls, "rx")
    connection = dtls.transport._connection
    stock_data_received = connection.data_received
    wanted = frozenset(payload_types)

    def data_received(data: bytes, component: int) -> None:
        if (
            len(data) > 1
            and 127 < data[0] < 192
            and data[1] not in RTCP_PACKET_TYPES
            and data[1] & 0x7F in wanted
        ):
            count(len(data))
            if not receiver._enabled:
                return
            try:
                rtp = unprotect(data)
            except pylibsrtp.Error:
                return
            take(rtp)
        else:
            stock_data_received(data, component)

    connection.data_received = data_received  # type: ignore[method-assign]
    for protocol in connection._protocols:
        _skip_stun_parse_of_media(protocol, connection)


def _skip_stun_parse_of_media(
    protocol: aioice.ice.StunProtocol, connection: aioice.ice.Connection
) -> None:
    """Hand RTP and RTCP datagrams on ``protocol`` to the connection without trying them as
    STUN first: aioice parses every datagram as a STUN message and takes the ``ValueError``
    as "data", a raised exception per media packet. A datagram whose first byte is 128-191
    is RTP or RTCP (RFC 7983 section 7); a STUN message's is 0 or 1."""
    candidate = getattr(protocol, "local_candidate", None)
    if type(protocol) is not aioice.ice.StunProtocol or candidate is None:
        return  # a TURN relay's protocol delivers its own way
    stock_datagram_received = protocol.datagram_received
    component = candidate.component

    def datagram_received(data: bytes | str, addr: tuple[Any, ...]) -> None:
        if isinstance(data, bytes) and len(data) > 1 and 127 < data[0] < 192:
            connection.data_received(data, component)
        else:
            stock_datagram_received(data, addr)

    protocol.datagram_received = datagram_received  # type: ignore[method-assign]
