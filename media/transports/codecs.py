"""The audio codecs a message socket carries, each with its own per-stream state.

Pipelines work on 48 kHz float32 mono. A socket client chooses PCM16 at a rate of its own
(a phone bridge 8 kHz, a speech backend 16 kHz) or Opus; the codec converts both ways with
resamplers kept for the life of the stream, so there is no click at any message boundary,
and polyphase ones (``media.audio.polyphase``), so 20 ms in is 20 ms out, not a block later.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from media.audio import mulaw
from media.audio.frames import FRAME_MS, RTC_RATE
from media.audio.opus import OpusDecoder, OpusError
from media.audio.polyphase import streaming_resampler

PCM_RATES = (8_000, 16_000, 24_000, 48_000)
MAX_MESSAGE_MS = 120  # the longest audio one message may carry (Opus' own longest packet)
_INT16_SCALE = 32768.0
SILENT_MULAW = b"\xff\x7f"  # mu-law's two codes for zero


class UndecodableAudio(ValueError):
    """A message's payload is not audio of the stream's codec."""


class SocketCodec(Protocol):
    """How one stream's audio is carried: decode what comes in, encode what goes out."""

    name: str
    rate: int

    def decode(self, payload: bytes) -> np.ndarray:
        """One message's payload to 48 kHz float32 mono; ``UndecodableAudio`` if it is not."""

    def encode(self, samples: np.ndarray, encoded: bytes) -> bytes:
        """One outgoing 20 ms frame (48 kHz float32 ``samples``; ``encoded``: the session's
        own Opus packet of it, when the codec wants one) as this codec's payload."""

    # Whether :meth:`encode` needs the session's Opus packet of each frame.
    wants_opus: bool

    def is_silent(self, payload: bytes) -> bool:
        """Whether an encoded payload is digital silence (sent as an empty payload)."""

    def close(self) -> None: ...


class _Resampled:
    """The resamplers both directions of a non-48 kHz codec keep."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._in = streaming_resampler(rate, RTC_RATE)
        self._out = streaming_resampler(RTC_RATE, rate)
        self._max_samples = rate * MAX_MESSAGE_MS // 1000
        self._frame = rate * FRAME_MS // 1000
        self._carry = np.zeros(0, np.float32)

    def _outgoing(self, samples: np.ndarray) -> np.ndarray:
        """One 48 kHz frame resampled to exactly one frame at ``rate``.

        The resampler's chunks vary by a few samples around the frame size; every message
        should hold exactly 20 ms (a phone network expects 160 mu-law bytes), so what runs
        over waits for the next frame, and the first frames are padded once by the
        resampler's delay.
        """
        out = self._out.process(samples)
        if len(self._carry):
            out = np.concatenate([self._carry, out])
        if len(out) < self._frame:
            out = np.concatenate([np.zeros(self._frame - len(out), np.float32), out])
        self._carry = out[self._frame :]
        return out[: self._frame]

    wants_opus = False

    def _check_length(self, samples: int) -> None:
        if samples > self._max_samples:
            raise UndecodableAudio(f"a message carries at most {MAX_MESSAGE_MS} ms of audio")

    def close(self) -> None:
        return


class Pcm16Codec(_Resampled):
    """Little-endian signed 16-bit mono samples at ``rate``."""

    name = "pcm16"

    def decode(self, payload: bytes) -> np.ndarray:
        if len(payload) % 2:
            raise UndecodableAudio("PCM16 payloads hold whole 16-bit samples (even length)")
        self._check_length(len(payload) // 2)
        pcm = np.frombuffer(payload, dtype="<i2").astype(np.float32) / _INT16_SCALE
        return self._in.process(pcm)

    def encode(self, samples: np.ndarray, encoded: bytes) -> bytes:
        out = self._outgoing(samples)
        return np.clip(out * _INT16_SCALE, -32768, 32767).astype("<i2").tobytes()

    def is_silent(self, payload: bytes) -> bool:
        return not payload.strip(b"\x00")


class MulawCodec(_Resampled):
    """G.711 mu-law at 8 kHz: what telephone networks carry."""

    name = "mulaw"

    def __init__(self, rate: int = 8_000) -> None:
        super().__init__(rate)

    def decode(self, payload: bytes) -> np.ndarray:
        self._check_length(len(payload))
        return self._in.process(mulaw.decode(payload))

    def encode(self, samples: np.ndarray, encoded: bytes) -> bytes:
        return mulaw.encode(self._outgoing(samples))

    def is_silent(self, payload: bytes) -> bool:
        return not payload.strip(SILENT_MULAW)


class OpusCodec:
    """One Opus packet per message, 48 kHz; outgoing packets are the session's own."""

    name = "opus"
    rate = RTC_RATE
    wants_opus = True

    def __init__(self) -> None:
        self._decoder = OpusDecoder(channels=1)

    def decode(self, payload: bytes) -> np.ndarray:
        try:
            return self._decoder.decode(payload)
        except OpusError as exc:
            raise UndecodableAudio(f"not an Opus packet: {exc}") from None

    def encode(self, samples: np.ndarray, encoded: bytes) -> bytes:
        return encoded

    def is_silent(self, payload: bytes) -> bool:
        return False  # Opus codes silence in a few bytes; its decoder keeps its state

    def close(self) -> None:
        self._decoder.close()


def codec_for(name: str, rate: int) -> SocketCodec:
    """A fresh codec state for one stream (``name`` and ``rate`` already validated)."""
    if name == "opus":
        return OpusCodec()
    if name == "mulaw":
        return MulawCodec(rate)
    return Pcm16Codec(rate)
