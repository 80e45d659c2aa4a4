"""The direct SRTP path: the same bytes as pylibsrtp's own methods, the same refusals."""

from __future__ import annotations

import struct

import pylibsrtp
import pytest

from media.rtc import srtp
from media.rtc.srtp import PacketCipher, packet_cipher

KEY = bytes(range(30))  # 16-byte master key + 14-byte salt (AES_CM_128_HMAC_SHA1_80)


def session(direction: int) -> pylibsrtp.Session:
    policy = pylibsrtp.Policy(key=KEY, ssrc_type=direction)
    return pylibsrtp.Session(policy=policy)


def rtp(seq: int, payload: bytes = b"\x78" * 80) -> bytes:
    return struct.pack("!BBHII", 0x80, 0xE1, seq, 960 * seq, 0x1234) + payload


def test_protect_gives_pylibsrtps_bytes_and_unprotect_gives_the_packet_back() -> None:
    stock, direct = (
        session(pylibsrtp.Policy.SSRC_ANY_OUTBOUND),
        session(pylibsrtp.Policy.SSRC_ANY_OUTBOUND),
    )
    cipher = PacketCipher(direct)
    receiver = PacketCipher(session(pylibsrtp.Policy.SSRC_ANY_INBOUND))
    for seq in range(1, 40):
        packet = rtp(seq, bytes([seq]) * (20 + seq))
        protected = cipher.protect(packet)
        assert protected == stock.protect(packet)
        assert len(protected) == len(packet) + 10  # the 80-bit tag
        assert receiver.unprotect(protected) == packet


def test_a_forged_or_replayed_packet_is_refused_as_pylibsrtp_refuses_it() -> None:
    sender = PacketCipher(session(pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
    receiver = PacketCipher(session(pylibsrtp.Policy.SSRC_ANY_INBOUND))
    protected = sender.protect(rtp(7))
    forged = protected[:-1] + bytes([protected[-1] ^ 1])
    with pytest.raises(pylibsrtp.Error, match="auth"):
        receiver.unprotect(forged)
    assert receiver.unprotect(protected) == rtp(7)  # the genuine one still passes...
    with pytest.raises(pylibsrtp.Error, match="replay"):
        receiver.unprotect(protected)  # ...once


def test_a_packet_too_long_to_protect_is_refused() -> None:
    sender = PacketCipher(session(pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
    with pytest.raises(ValueError, match="too long"):
        sender.protect(rtp(1, b"\0" * 1400))


def test_another_pylibsrtp_version_gets_the_sessions_own_methods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tx = session(pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
    monkeypatch.setattr(srtp, "CHECKED_PYLIBSRTP_VERSION", "0.0.0")
    protect, unprotect = packet_cipher(tx)
    assert protect == tx.protect and unprotect == tx.unprotect
