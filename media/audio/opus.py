"""A direct libopus binding: decoding with loss concealment and FEC, and a tunable encoder.

PyAV's Opus codec (what aiortc uses) has no call for packet-loss concealment or in-band
FEC and is fixed at stereo 96 kb/s ``voip``. The libopus that PyAV's wheel bundles exports
the whole C API, so this module binds it with ctypes: the decoder can conceal a lost packet
(``opus_decode`` with no data) or recover it from the next packet's FEC copy, and the
encoder takes a per-session application, bitrate, channel count and FEC setting.

ctypes releases the GIL during these calls; each one costs tens of microseconds.
"""

from __future__ import annotations

import ctypes
import enum
import glob
import os
from functools import cache

import av
import numpy as np

RATE = 48_000
MAX_FRAME_SAMPLES = 5760  # 120 ms at 48 kHz, the longest Opus packet
MAX_PACKET_BYTES = 1500
CELT_ONLY_CONFIGS = 16  # TOC configurations from here on code CELT only (no SILK layer)

_OPUS_OK = 0
_SET_BITRATE = 4002
_SET_COMPLEXITY = 4010
_SET_INBAND_FEC = 4012
_SET_PACKET_LOSS_PERC = 4014
_GET_LOOKAHEAD = 4027
_SET_PREDICTION_DISABLED = 4042


class OpusError(RuntimeError):
    """libopus returned an error code; the message is libopus's own."""


class Application(enum.IntEnum):
    VOIP = 2048  # speech: the default for calls
    AUDIO = 2049
    RESTRICTED_LOWDELAY = 2051  # CELT only: ~5 ms less delay, no SILK speech coding


@cache
def _lib() -> ctypes.CDLL:
    """The libopus shipped inside PyAV's wheel (or the system one as a fallback)."""
    libs_dir = os.path.join(os.path.dirname(os.path.dirname(av.__file__)), "av.libs")
    candidates = sorted(glob.glob(os.path.join(libs_dir, "libopus*.so*")))
    candidates += ["libopus.so.0", "libopus.so"]
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate)
            break
        except OSError:
            continue
    else:
        raise OpusError("libopus not found: reinstall PyAV (pip install av) or install libopus0")
    c_int, c_void_p, c_char_p = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, c_int, ctypes.POINTER(c_int)]
    lib.opus_decoder_create.restype = c_void_p
    lib.opus_decoder_destroy.argtypes = [c_void_p]
    lib.opus_decode_float.argtypes = [
        c_void_p,
        c_char_p,
        ctypes.c_int32,
        ctypes.c_void_p,
        c_int,
        c_int,
    ]
    lib.opus_decode_float.restype = c_int
    lib.opus_encoder_create.argtypes = [ctypes.c_int32, c_int, c_int, ctypes.POINTER(c_int)]
    lib.opus_encoder_create.restype = c_void_p
    lib.opus_encoder_destroy.argtypes = [c_void_p]
    lib.opus_encode_float.argtypes = [c_void_p, ctypes.c_void_p, c_int, c_char_p, ctypes.c_int32]
    lib.opus_encode_float.restype = ctypes.c_int32
    lib.opus_strerror.argtypes = [c_int]
    lib.opus_strerror.restype = c_char_p
    lib.opus_packet_has_lbrr.argtypes = [c_char_p, ctypes.c_int32]
    lib.opus_packet_has_lbrr.restype = c_int
    return lib


def _check(code: int, what: str) -> int:
    if code < 0:
        raise OpusError(f"{what}: {_lib().opus_strerror(code).decode()}")
    return code


def packet_has_fec(payload: bytes) -> bool:
    """Whether ``payload`` carries an in-band FEC copy of the packet before it.

    The copy lives in the SILK layer: a CELT-only packet (TOC configurations 16-31, RFC
    6716 section 3.1) has none, which its first byte tells without a call into libopus.
    """
    if not payload or payload[0] >> 3 >= CELT_ONLY_CONFIGS:
        return False
    return bool(_lib().opus_packet_has_lbrr(payload, len(payload)) == 1)


class OpusDecoder:
    """Decodes to float32 at 48 kHz, mono by default (libopus downmixes a stereo stream)."""

    def __init__(self, channels: int = 1) -> None:
        error = ctypes.c_int()
        self._state = _lib().opus_decoder_create(RATE, channels, ctypes.byref(error))
        _check(error.value, "opus_decoder_create")
        self.channels = channels
        self._pcm = np.zeros(MAX_FRAME_SAMPLES * channels, dtype=np.float32)
        # Its address, read once: numpy's ``.ctypes`` costs about a microsecond per read.
        self._pcm_address = self._pcm.ctypes.data

    def _decode(self, payload: bytes | None, samples: int, fec: bool) -> np.ndarray:
        if self._state is None:
            raise OpusError("decoder is closed")
        if samples > MAX_FRAME_SAMPLES:  # libopus would write past the end of self._pcm
            raise OpusError(f"at most {MAX_FRAME_SAMPLES} samples per call, not {samples}")
        size = len(payload) if payload else 0
        frames = _lib().opus_decode_float(
            self._state, payload or None, size, self._pcm_address, samples, int(fec)
        )
        _check(frames, "opus_decode_float")
        return self._pcm[: frames * self.channels].copy()

    def decode(self, payload: bytes) -> np.ndarray:
        """Decode one packet."""
        return self._decode(payload, MAX_FRAME_SAMPLES, fec=False)

    def conceal(self, samples: int) -> np.ndarray:
        """Synthesise ``samples`` (a multiple of 2.5 ms) for a lost packet (libopus PLC)."""
        return self._decode(None, samples, fec=False)

    def recover(self, next_payload: bytes, samples: int) -> np.ndarray:
        """Rebuild the lost packet before ``next_payload`` from its FEC copy (PLC if none)."""
        return self._decode(next_payload, samples, fec=True)

    def close(self) -> None:
        if self._state is not None:
            _lib().opus_decoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()


class OpusEncoder:
    """Encodes float32 frames at 48 kHz with per-session settings."""

    def __init__(
        self,
        channels: int = 1,
        application: Application = Application.VOIP,
        bitrate: int = 48_000,
        fec: bool = False,
        expected_loss_percent: int = 0,
    ) -> None:
        lib = _lib()
        error = ctypes.c_int()
        self._state = lib.opus_encoder_create(RATE, channels, int(application), ctypes.byref(error))
        _check(error.value, "opus_encoder_create")
        self.channels = channels
        self.application = application
        self.fec = fec
        self._out = ctypes.create_string_buffer(MAX_PACKET_BYTES)
        # Each frame is copied here (converted to float32 on the way) and libopus reads it at
        # an address taken once: numpy's ``.ctypes`` costs about a microsecond per read.
        self._in = np.zeros(MAX_FRAME_SAMPLES * channels, dtype=np.float32)
        self._in_address = self._in.ctypes.data
        self._ctl(_SET_BITRATE, bitrate)
        self._ctl(_SET_INBAND_FEC, int(fec))
        self._ctl(_SET_PACKET_LOSS_PERC, expected_loss_percent if fec else 0)
        lookahead = ctypes.c_int32()
        _check(
            lib.opus_encoder_ctl(
                ctypes.c_void_p(self._state), _GET_LOOKAHEAD, ctypes.byref(lookahead)
            ),
            "OPUS_GET_LOOKAHEAD",
        )
        self.lookahead_samples = lookahead.value

    def _ctl(self, request: int, value: int) -> None:
        # opus_encoder_ctl is variadic, so ctypes cannot know the types: spell them out.
        if self._state is None:
            raise OpusError("encoder is closed")  # a NULL state would crash libopus
        state = ctypes.c_void_p(self._state)
        _check(_lib().opus_encoder_ctl(state, request, ctypes.c_int32(value)), str(request))

    def set_complexity(self, complexity: int) -> None:
        self._ctl(_SET_COMPLEXITY, complexity)

    def set_expected_loss(self, percent: int) -> None:
        """The packet loss to plan for: with FEC on and above 0, each packet carries a copy
        of the one before it (libopus then codes in its SILK or hybrid modes)."""
        self._ctl(_SET_PACKET_LOSS_PERC, percent if self.fec else 0)

    def set_prediction_disabled(self, disabled: bool) -> None:
        """Code the next frames independently of the ones before (no inter-frame prediction):
        the decoder then follows a sudden drop to silence within the frame, where predicted
        energies decay over the next packet (used after an interrupt's fade)."""
        self._ctl(_SET_PREDICTION_DISABLED, int(disabled))

    def encode(self, pcm: np.ndarray) -> bytes:
        """Encode one frame (2.5-60 ms of float32 samples, interleaved when stereo)."""
        if self._state is None:
            raise OpusError("encoder is closed")
        length = len(pcm)
        if length > len(self._in):
            raise OpusError(f"at most {len(self._in)} samples per frame, not {length}")
        self._in[:length] = pcm
        size = _lib().opus_encode_float(
            self._state, self._in_address, length // self.channels, self._out, MAX_PACKET_BYTES
        )
        _check(size, "opus_encode_float")
        return self._out.raw[:size]

    def close(self) -> None:
        if self._state is not None:
            _lib().opus_encoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()
