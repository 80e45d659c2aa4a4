"""SRTP protect and unprotect of one RTP packet, without pylibsrtp's per-call allocations.

``pylibsrtp.Session.protect`` allocates a C ``int`` for the length on every call and goes
through two Python frames and a type check before libsrtp runs; with every packet of every
call passing here twice (the caller's in, the answer out), that was about as much time as
libsrtp's own work. :class:`PacketCipher` calls the same libsrtp functions on the same
session, with its buffer and length allocated once.

It reads pylibsrtp's private handle of the libsrtp session (``Session._srtp``), so it is
used only on the pylibsrtp version it was checked against (:data:`CHECKED_PYLIBSRTP_VERSION`);
on any other, :func:`packet_cipher` hands out the session's own methods.
"""

from __future__ import annotations

from collections.abc import Callable

import pylibsrtp
from pylibsrtp._binding import ffi, lib

CHECKED_PYLIBSRTP_VERSION = "1.0.0"
BUFFER_BYTES = 1500  # pylibsrtp's own buffer: a packet longer than that is refused, as there
TRAILER_BYTES = pylibsrtp.SRTP_MAX_TRAILER_LEN  # the tag and MKI that protect may append

Transform = Callable[[bytes], bytes]


class PacketCipher:
    """Protects and unprotects RTP packets of one libsrtp session (never RTCP).

    Raises ``pylibsrtp.Error`` as the session's own methods do (a packet that fails
    authentication or replays one), ``ValueError`` for a packet too long to protect.
    """

    def __init__(self, session: pylibsrtp.Session) -> None:
        self._session = session  # keeps the libsrtp session alive (its finaliser frees it)
        self._handle = session._srtp[0]
        self._data = ffi.new("char[]", BUFFER_BYTES)
        self._buffer = ffi.buffer(self._data)
        self._length = ffi.new("int *")

    def protect(self, packet: bytes) -> bytes:
        return self._run(packet, lib.srtp_protect, BUFFER_BYTES - TRAILER_BYTES)

    def unprotect(self, packet: bytes) -> bytes:
        return self._run(packet, lib.srtp_unprotect, BUFFER_BYTES)

    def _run(self, packet: bytes, function: Callable[..., int], longest: int) -> bytes:
        size = len(packet)
        if size > longest:
            raise ValueError("packet is too long")
        self._buffer[0:size] = packet
        self._length[0] = size
        status = function(self._handle, self._data, self._length)
        if status != lib.srtp_err_status_ok:
            errors = pylibsrtp.ERRORS
            raise pylibsrtp.Error(errors[status] if 0 <= status < len(errors) else str(status))
        return self._buffer[0 : self._length[0]]


def packet_cipher(session: pylibsrtp.Session) -> tuple[Transform, Transform]:
    """(protect, unprotect) for the RTP packets of ``session``."""
    if pylibsrtp.__version__ != CHECKED_PYLIBSRTP_VERSION or not hasattr(session, "_srtp"):
        return session.protect, session.unprotect
    cipher = PacketCipher(session)
    return cipher.protect, cipher.unprotect
