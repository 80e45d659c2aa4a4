"""Acoustic echo cancellation for callers on a loudspeaker, with WebRTC's AEC3.

A caller who plays our speech through a loudspeaker sends it back to us, delayed by the round
trip and attenuated by the room. Before the caller's audio is searched for speech (barge-in),
the echo canceller subtracts what it can predict from the reference, the audio we sent.

The binding in ``pywebrtc-audio`` runs AEC3 alone (its own high-pass filter in front, no noise
suppression, no gain control) at 48 kHz natively, splitting each 10 ms frame into three bands.
Its only call, ``process(near, far)``, takes the same number of reference and microphone
samples and for each 10 ms frame hands AEC3 the reference frame first, then the microphone
frame: the order a real-time server sees them in. Reference and microphone arrive on separate
tracks here, so ``render`` queues the reference and ``capture`` pairs each microphone sample
with the oldest queued reference sample.

Delay: AEC3 finds the echo path delay on its own, by correlating the two streams. Measured
with espeak speech through a simulated room (see the tests): paths from 0 to 500 ms all reach
~35 dB of suppression after two seconds (24-31 dB before), 550-650 ms lock on and lose it
again, 700 ms never does (~2 dB). The binding's ``stream_delay_ms`` (the binding hands it to
AEC3 as the audio buffer delay, which seeds the estimate before it locks on) changed nothing
at the right value, cost the first second at a wrong one, and did not extend the range, so it
stays 0. A path longer than the range (a far caller behind deep jitter buffers) is brought
into it with ``reference_delay_ms``: 700 ms with 400 ms of it gets the same ~35 dB.

The delay AEC3 has to find is the echo path delay minus the time the reference it is handed
has waited in the queue. It must not go below zero: echo that arrives before its reference
is not cancelled (measured: 18 dB at -10 ms, 7 dB at -20 ms, none at -40 ms). Captures drain
the queue one frame per frame, so its depth stays what it was when the microphone's audio
began and grows a frame with each incoming packet lost; ``max_lead_ms`` caps it. Dropping
reference costs a moment of uncancelled echo after the incoming track stalls; an unbounded
queue would cost the cancellation for the rest of the call. With the 60 ms default the
apparent delay is at most 40 ms short of the true one, and a WebRTC echo path (packetisation,
both jitter buffers, the device buffers, the network) is longer than that. The counters
``reference_dropped`` and ``reference_missing`` show how often either edge is hit.

Double talk: AEC3's suppressor lets the caller's words through 3-4 dB down while our speech
keeps playing, but tends to mute the first word or two, so a barge-in over our speech is
detected 0.25-1.2 s after the caller starts rather than the ~0.2 s it takes in silence.

Cost: see ``FRAME_COST_US``, the same for every kind of frame, our silence included. While
we say nothing there is nothing to cancel, so once every reference sample paired with the
microphone for ``QUIET_TAIL_MS`` (longer than the longest echo path AEC3 locks on to, above)
has been zero, ``capture`` hands the microphone's audio on as it is and AEC3 is not called.
Both streams are left out alike, so AEC3 sees them just as aligned when we speak again, its
filters as it left them and the reference history before it zeros, as it was. A speak session
that listens more than it speaks pays for the canceller only while it speaks.
Each session owns its native instance; instances are not
thread-safe, but one session's calls never overlap, and the binding releases the GIL around
its loop over the 10 ms frames, so sessions on a thread pool run in parallel.
"""

from __future__ import annotations

import numpy as np
from pywebrtc_audio import EchoCanceller as Aec3

from media.audio.ringbuffer import RingBuffer

SAMPLE_RATE = 48_000  # AEC3 runs at 48 kHz natively: no resampling on either stream
BLOCK = SAMPLE_RATE // 100  # 480: the binding works in 10 ms frames and zero-pads a short one
# Reference queued after a render: the frame just sent plus two waiting for their capture.
MAX_LEAD_MS = 60.0
# AEC3 is left to find the delay itself; see the module docstring.
STREAM_DELAY_HINT_MS = 0
# One 20 ms capture (two AEC3 frames and the Python around them) on a 2-vCPU AMD EPYC KVM
# guest: 240 us at best, a median of ~300 us while other processes kept both cores busy, so
# ~1.5 % of a core in real time; a render costs 5-20 us. Speech, echo, double talk and
# silence cost the same (230-235 us at best).
FRAME_COST_US = 240
QUIET_TAIL_MS = 700.0


def _samples(ms: float) -> int:
    return round(ms * SAMPLE_RATE / 1000)


class EchoCanceller:
    """One session's echo canceller: ``render`` what is sent, ``capture`` what comes back.

    Both take float32 mono at 48 kHz, any length. ``capture`` returns the cleaned signal for
    every whole 10 ms it has; with 20 ms frames that is exactly the frame, without delay.
    """

    def __init__(self, max_lead_ms: float = MAX_LEAD_MS, reference_delay_ms: float = 0.0) -> None:
        if _samples(max_lead_ms) < BLOCK or reference_delay_ms < 0:
            raise ValueError("need max_lead_ms >= 10 and reference_delay_ms >= 0")
        self._aec = Aec3(SAMPLE_RATE, 1, STREAM_DELAY_HINT_MS)
        # Holds the frame just rendered plus what earlier captures have not taken yet.
        self._queue = RingBuffer(_samples(max_lead_ms))
        self._reference_delay = _samples(reference_delay_ms)
        self._delay_line: RingBuffer | None = None
        if self._reference_delay:
            # Room beyond the delay for one render call of up to a second.
            self._delay_line = RingBuffer(self._reference_delay + SAMPLE_RATE)
            self._delay_line.write(np.zeros(self._reference_delay, np.float32))
        self._pending = np.zeros(BLOCK, np.float32)  # microphone samples short of a block
        self._filled = 0
        self._quiet_tail = _samples(QUIET_TAIL_MS)
        self._quiet = self._quiet_tail  # paired reference samples that were zero, in a row
        self.reference_dropped = 0  # rendered samples no capture paired with
        self.reference_missing = 0  # captured samples paired with silence for lack of one
        self.blocks_passed = 0  # 10 ms blocks handed on as they came: nothing to cancel

    def render(self, reference: np.ndarray) -> None:
        """Queue reference audio at the moment it is sent to the caller."""
        reference = np.asarray(reference, dtype=np.float32)
        if self._delay_line is not None:
            self._delay_line.write(reference)
            reference = self._delay_line.read(reference.size)
        self.reference_dropped += self._queue.write(reference)

    def capture(self, mic: np.ndarray) -> np.ndarray:
        """Remove the echo from microphone audio as it arrives; returns whole 10 ms blocks."""
        mic = np.asarray(mic, dtype=np.float32)
        if self._filled:
            mic = np.concatenate([self._pending[: self._filled], mic])
        usable = mic.size // BLOCK * BLOCK
        rest = mic.size - usable
        self._pending[:rest] = mic[usable:]
        self._filled = rest
        if usable == 0:
            return np.zeros(0, np.float32)
        reference = np.zeros(usable, np.float32)
        got = self._queue.read(usable, reference).size
        self.reference_missing += usable - got
        speaking = np.flatnonzero(reference)
        if speaking.size:
            self._quiet = usable - 1 - int(speaking[-1])
        else:
            self._quiet += usable
        if self._quiet >= self._quiet_tail + usable:  # no echo can be in these blocks
            self.blocks_passed += usable // BLOCK
            return mic[:usable].copy()
        return self._aec.process(np.ascontiguousarray(mic[:usable]), reference)

    def reset(self) -> None:
        """Start over: fresh filters and delay estimate, empty queues."""
        self._aec.reset()
        self._queue.clear()
        if self._delay_line is not None:
            self._delay_line.clear()
            self._delay_line.write(np.zeros(self._reference_delay, np.float32))
        self._filled = 0
        self._quiet = self._quiet_tail
