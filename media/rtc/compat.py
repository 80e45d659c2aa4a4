"""Adaptations of aiortc internals, each checked against the pinned version it was written for.

aiortc offers no public hook for these. Each adaptation is an explicit ``apply``/``restore``
pair (never an import-time side effect), and :func:`check_versions` refuses to start on an
aiortc other than the one they were checked against, so an upgrade is a conscious change.

DTLS cipher suites
    aiortc 1.16.0 offers only ECDHE-ECDSA suites (``RTCCertificate._create_ssl_context``),
    so a peer with an RSA certificate has no suite in common with it: GStreamer's webrtcbin
    (and so ``whipsink``/``simple-whip-client``) fails with "no shared cipher" as the DTLS
    server (aiortc issues #1392, #1434). :func:`accept_rsa_dtls_peers` sets a list that also
    holds the ECDHE-RSA AEAD suites. Nothing weaker is added: every suite keeps forward
    secrecy (ECDHE), the only CBC suites are the two ECDHE-ECDSA ones aiortc already had,
    and the list stays short, so the ClientHello is not fragmented (aiortc #956: OBS's Mbed
    TLS cannot reassemble a fragmented one). The suite that decides is the one whose
    signature matches the DTLS server's certificate, so ECDSA peers (browsers) still
    negotiate ECDHE-ECDSA-AES128-GCM-SHA256, RFC 8827's mandatory suite, first.
    Remove when aiortc's own list accepts RSA certificates (pull request #1421 or similar
    lands): delete this adaptation and raise the pin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiortc
from aiortc.rtcdtlstransport import RTCCertificate
from OpenSSL import SSL

CHECKED_AIORTC_VERSION = "1.16.0"

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

_stock_create_ssl_context: Callable[..., SSL.Context] = RTCCertificate._create_ssl_context


class UncheckedVersion(RuntimeError):
    """The installed aiortc is not the one these adaptations were checked against."""


def check_versions() -> None:
    """Refuse to run the adaptations on an aiortc they were not written for."""
    if aiortc.__version__ != CHECKED_AIORTC_VERSION:
        raise UncheckedVersion(
            f"aiortc {aiortc.__version__} is installed; media.rtc.compat was checked against "
            f"{CHECKED_AIORTC_VERSION}: re-check each adaptation, then update the pin"
        )


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
