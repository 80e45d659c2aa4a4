"""DTLS between aiortc and peers whose certificate is RSA (GStreamer's webrtcbin) or ECDSA.

The handshakes run over memory BIOs with the exact SSL contexts aiortc builds, so they show
what a real call negotiates without a network. Before the adaptation an RSA peer acting as
DTLS server failed with ``no shared cipher``, which is how every ``simple-whip-client``
publish ended.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from aiortc.rtcdtlstransport import SRTP_AES128_CM_SHA1_80, RTCCertificate, generate_certificate
from cryptography.hazmat.primitives.asymmetric import rsa
from OpenSSL import SSL

from media.rtc import compat

SRTP = [SRTP_AES128_CM_SHA1_80]


@pytest.fixture
def adapted() -> Iterator[None]:
    compat.accept_rsa_dtls_peers()
    yield
    compat.restore_dtls_ciphers()


def gstreamer_like_server() -> SSL.Connection:
    """A DTLS server as GStreamer's dtls element makes one: RSA key, OpenSSL's default suites."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    context = SSL.Context(SSL.DTLS_METHOD)
    context.use_certificate(generate_certificate(key))  # type: ignore[arg-type]
    context.use_privatekey(key)
    context.set_verify(SSL.VERIFY_PEER, lambda *args: True)
    context.set_tlsext_use_srtp(b"SRTP_AES128_CM_SHA1_80")
    connection = SSL.Connection(context)
    connection.set_accept_state()
    return connection


def aiortc_endpoint(server: bool = False) -> SSL.Connection:
    connection = SSL.Connection(RTCCertificate.generateCertificate()._create_ssl_context(SRTP))
    if server:
        connection.set_accept_state()
    else:
        connection.set_connect_state()
    return connection


def handshake(client: SSL.Connection, server: SSL.Connection) -> str:
    """Shuttle flights between the two until both finish; return the negotiated suite."""
    for _ in range(20):
        for side in (client, server):
            with contextlib.suppress(SSL.WantReadError):
                side.do_handshake()
        for sender, receiver in ((client, server), (server, client)):
            while True:
                try:
                    flight = sender.bio_read(65536)
                except SSL.WantReadError:
                    break
                receiver.bio_write(flight)
        if client.get_cipher_name() and server.get_cipher_name():
            try:
                client.do_handshake()
                server.do_handshake()
            except SSL.WantReadError:
                continue
            return str(client.get_cipher_name())
    raise AssertionError("handshake did not finish")


def test_stock_aiortc_cannot_talk_to_an_rsa_dtls_server() -> None:
    """The failure itself, so the test below proves the adaptation and not a lucky default."""
    compat.restore_dtls_ciphers()
    with pytest.raises(SSL.Error, match="no shared cipher"):
        handshake(aiortc_endpoint(), gstreamer_like_server())


def test_rsa_dtls_server_negotiates_an_ecdhe_rsa_aead_suite(adapted: None) -> None:
    assert handshake(aiortc_endpoint(), gstreamer_like_server()) == "ECDHE-RSA-AES128-GCM-SHA256"


def test_ecdsa_peers_still_negotiate_the_mandatory_suite(adapted: None) -> None:
    """Browsers (ECDSA) keep RFC 8827's TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256."""
    assert handshake(aiortc_endpoint(), aiortc_endpoint(server=True)) == (
        "ECDHE-ECDSA-AES128-GCM-SHA256"
    )


def test_nothing_weaker_is_offered(adapted: None) -> None:
    """Forward secrecy for every suite; no CBC suites beyond the two aiortc already had."""
    # OpenSSL also lists its TLS 1.3 suites, which DTLS 1.2 never uses.
    offered = [s for s in aiortc_endpoint().get_cipher_list() if not s.startswith("TLS_")]
    assert offered == list(compat.DTLS_CIPHER_SUITES)
    assert all(name.startswith("ECDHE-") for name in offered)
    cbc = [name for name in offered if not name.endswith(("GCM-SHA256", "GCM-SHA384", "POLY1305"))]
    assert cbc == ["ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA"]


def test_client_hello_fits_one_datagram(adapted: None) -> None:
    """OBS's Mbed TLS cannot reassemble a fragmented ClientHello (aiortc #956)."""
    client = aiortc_endpoint()
    with pytest.raises(SSL.WantReadError):
        client.do_handshake()
    assert len(client.bio_read(65536)) < 1200


def test_adaptations_refuse_an_unchecked_aiortc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat.aiortc, "__version__", "9.9.9")
    with pytest.raises(compat.UncheckedVersion, match=r"checked against 1\.16\.0"):
        compat.accept_rsa_dtls_peers()
