"""Voice activity detection with Silero VAD, for noticing a caller who starts to talk.

The model is the ONNX file bundled in the ``silero-vad`` wheel, run with onnxruntime directly:
the package's own Python modules import torch, which this server does not install, so the
package is installed with ``--no-deps`` and only its data file is read.

Silero VAD v5/v6 works on 16 kHz audio in windows of exactly 512 samples (32 ms). Each call
takes the window with the last 64 samples of the previous one in front of it (576 in all) and a
recurrent state of shape (2, 1, 128), and returns one speech probability and the next state.
That is how ``silero_vad.utils_vad.OnnxWrapper`` feeds it; zeros in place of the context score
speech a little lower (mean 0.873 against 0.886 on the test sentences).

The weights are read once per process into one ``InferenceSession``; everything that belongs to
a stream (recurrent state, context, resampler, the samples short of a window) lives in a
``VadState``. onnxruntime allows concurrent ``run`` calls on one session and releases the GIL
while the model runs, so sessions on a thread pool share it safely.

Cost: see ``WINDOW_COST_US``; the soxr resampling from 48 kHz takes ~9 us per 20 ms chunk.
"""

from __future__ import annotations

import enum
import importlib.util
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from media.audio.resample import StreamResampler

INPUT_RATE = 48_000  # what WebRTC delivers
MODEL_RATE = 16_000
WINDOW = 512  # samples per model call at 16 kHz: the only size v5/v6 accept at this rate
CONTEXT = 64  # samples of the previous window put in front of each window
WINDOW_MS = WINDOW * 1000 / MODEL_RATE  # 32 ms
STATE_SHAPE = (2, 1, 128)
MODEL_PACKAGE = "silero_vad"
MODEL_FILE = Path("data") / "silero_vad.onnx"  # v6, opset 16, takes 8 and 16 kHz
INSTALL_HINT = "pip install --no-deps silero-vad==6.2.3"
# One model call (one 32 ms window) with one intra-op thread on a 2-vCPU AMD EPYC KVM guest
# (AVX2, no AVX-512): 150-160 us at best, a median of 190-270 us while other processes kept
# both cores busy; 0.5-0.9 % of a core in real time. The Python around it (resampling, copying
# into the window) adds 10-40 us per 20 ms chunk. The file's other variants (opset 15 and 18,
# 16 kHz only, without the sample-rate branch) and ``run_with_ort_values`` were no faster.
WINDOW_COST_US = 160

# Detector defaults. Silero's own streaming iterator starts at 0.5 and ends below 0.35
# (threshold - 0.15). In the tests nothing but speech reached 0.5 for even one window: white
# noise from -40 to -12 dBFS, clicks, noise bursts, the pauses of speech at 0 dB SNR (0.31 at
# most) and the echo canceller's residual (0.35 at most, echo at -3 dB). The 150 ms are for
# what a synthetic test does not cover, coughs, lip smacks and breaths, for ~100 ms of added
# latency: a caller who starts talking is detected 150-320 ms after the first sound.
# 300 ms of quiet ends speech without splitting a sentence at its commas: 200 ms split
# "Wait, stop, I have a question" after "Wait", 300 ms did not.
START_THRESHOLD = 0.5
STOP_THRESHOLD = 0.35
START_MS = 150.0
STOP_MS = 300.0


class VadUnavailable(RuntimeError):
    """The Silero model file or onnxruntime is missing; the message says what to install."""


def model_path() -> Path:
    """Path of the ONNX file inside the installed ``silero_vad`` package.

    ``find_spec`` locates the package without running its ``__init__``, which imports torch.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise VadUnavailable(f"the {MODEL_PACKAGE} package is not installed; {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise VadUnavailable(f"{path} is missing; {INSTALL_HINT}")
    return path


_session_lock = threading.Lock()
_session: ort.InferenceSession | None = None


def shared_session() -> ort.InferenceSession:
    """The process's one session, made on first use.

    One intra-op and one inter-op thread: a 576-sample window is far too small to split, and
    sessions already run in parallel on the media thread pool.
    """
    global _session
    with _session_lock:
        if _session is None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            options.log_severity_level = 3  # the file's unused initialisers warn on every load
            _session = ort.InferenceSession(
                str(model_path()), options, providers=["CPUExecutionProvider"]
            )
        return _session


@dataclass(eq=False)
class VadState:
    """One stream's recurrent state, resampler and the 16 kHz samples short of a window."""

    resampler: StreamResampler
    rnn: np.ndarray = field(default_factory=lambda: np.zeros(STATE_SHAPE, np.float32))
    # [0:CONTEXT] holds the previous window's tail, [CONTEXT:CONTEXT + filled] the new samples.
    buffer: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT + WINDOW, np.float32))
    filled: int = 0


class SileroVad:
    """Speech probability per 32 ms window of 48 kHz float32 mono, for any number of streams."""

    def __init__(self, session: ort.InferenceSession | None = None) -> None:
        self._session = session if session is not None else shared_session()
        self._rate = np.array(MODEL_RATE, dtype=np.int64)

    def new_state(self) -> VadState:
        return VadState(StreamResampler(INPUT_RATE, MODEL_RATE))

    def process(self, state: VadState, chunk: np.ndarray) -> list[float]:
        """Feed a chunk of any length; return the probabilities of the windows it completed.

        A 20 ms chunk completes a window about two times in three. The results do not depend
        on how the stream is cut into chunks.
        """
        samples = state.resampler.process(np.ascontiguousarray(chunk, dtype=np.float32))
        probabilities: list[float] = []
        buffer = state.buffer
        start = 0
        while start < samples.size:
            take = min(WINDOW - state.filled, samples.size - start)
            at = CONTEXT + state.filled
            buffer[at : at + take] = samples[start : start + take]
            state.filled += take
            start += take
            if state.filled == WINDOW:
                probabilities.append(self._run(state))
        return probabilities

    def _run(self, state: VadState) -> float:
        buffer = state.buffer
        out, state.rnn = self._session.run(
            None, {"input": buffer[np.newaxis, :], "state": state.rnn, "sr": self._rate}
        )
        buffer[:CONTEXT] = buffer[-CONTEXT:]
        state.filled = 0
        return float(out[0, 0])

    def reset(self, state: VadState) -> None:
        """Forget the stream: after a gap the old state and context no longer belong."""
        state.resampler.reset()
        state.rnn = np.zeros(STATE_SHAPE, np.float32)
        state.buffer[:] = 0.0
        state.filled = 0


class WindowCutter:
    """One stream's 48 kHz audio as whole 16 kHz model windows, for the batched model."""

    def __init__(self) -> None:
        self._resampler = StreamResampler(INPUT_RATE, MODEL_RATE)
        self._buffer = np.zeros(WINDOW, np.float32)
        self._filled = 0

    def cut(self, chunk: np.ndarray) -> list[np.ndarray]:
        """The windows ``chunk`` completes (often none, sometimes one, rarely two)."""
        samples = self._resampler.process(np.ascontiguousarray(chunk, dtype=np.float32))
        windows: list[np.ndarray] = []
        start = 0
        while start < samples.size:
            take = min(WINDOW - self._filled, samples.size - start)
            self._buffer[self._filled : self._filled + take] = samples[start : start + take]
            self._filled += take
            start += take
            if self._filled == WINDOW:
                windows.append(self._buffer.copy())
                self._filled = 0
        return windows


class BatchedVad:
    """Silero VAD for many streams at once: each stream's recurrent state and context in a
    slot of batch arrays, one model call for a window of every stream that has one.

    The model's batch axis is free (the recurrent state is (2, batch, 128)), so a step is
    the single-stream call with rows stacked: ~32 us per stream at batch 32 against ~70 us
    alone on this machine. The caller runs one ``process`` at a time (the tick scheduler
    does) and opens, resets or closes slots between steps.
    """

    hop = WINDOW

    def __init__(self, session: ort.InferenceSession | None = None, capacity: int = 16) -> None:
        self._session = session if session is not None else shared_session()
        self._rate = np.array(MODEL_RATE, dtype=np.int64)
        self._rnn = np.zeros((2, capacity, 128), np.float32)
        self._context = np.zeros((capacity, CONTEXT), np.float32)
        self._free = list(range(capacity - 1, -1, -1))

    def open_slot(self) -> int:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.reset_slot(slot)
        return slot

    def reset_slot(self, slot: int) -> None:
        self._rnn[:, slot] = 0.0
        self._context[slot] = 0.0

    def close_slot(self, slot: int) -> None:
        self._free.append(slot)

    def _grow(self) -> None:
        size = self._context.shape[0]
        self._rnn = np.concatenate([self._rnn, np.zeros_like(self._rnn)], axis=1)
        self._context = np.concatenate([self._context, np.zeros_like(self._context)])
        self._free.extend(range(2 * size - 1, size - 1, -1))

    def process(self, slots: Sequence[int], windows: np.ndarray) -> np.ndarray:
        """One window per listed stream ([n, 512] at 16 kHz) -> their probabilities ([n, 1])."""
        rows = np.asarray(slots)
        batch = np.concatenate([self._context[rows], windows], axis=1)
        out, rnn = self._session.run(
            None, {"input": batch, "state": self._rnn[:, rows], "sr": self._rate}
        )
        self._rnn[:, rows] = rnn
        self._context[rows] = windows[:, -CONTEXT:]
        return np.asarray(out, np.float32).reshape(len(rows), 1)


class SpeechEventKind(enum.StrEnum):
    START = "speech_start"
    END = "speech_end"


@dataclass(frozen=True)
class SpeechEvent:
    kind: SpeechEventKind
    at_ms: float  # stream time at the end of the window that decided it


@dataclass(eq=False)
class SpeechDetector:
    """Hysteresis over window probabilities, one per stream.

    Speech starts once ``start_ms`` of consecutive windows reach ``start_threshold`` and ends
    once ``stop_ms`` of consecutive windows fall below ``stop_threshold``; in between the state
    holds, so a voice that dips on a consonant does not end and restart.
    """

    start_threshold: float = START_THRESHOLD
    stop_threshold: float = STOP_THRESHOLD
    start_ms: float = START_MS
    stop_ms: float = STOP_MS
    speaking: bool = field(default=False, init=False)
    _run: int = field(default=0, init=False)  # consecutive windows towards the next change
    _windows: int = field(default=0, init=False)  # windows seen, for the events' times
    _start_windows: int = field(init=False)
    _stop_windows: int = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.stop_threshold <= self.start_threshold < 1.0:
            raise ValueError("need 0 < stop_threshold <= start_threshold < 1")
        # Whole windows: 150 ms needs 5 windows (160 ms) of speech.
        self._start_windows = max(1, math.ceil(self.start_ms / WINDOW_MS))
        self._stop_windows = max(1, math.ceil(self.stop_ms / WINDOW_MS))

    def update(self, probabilities: Iterable[float]) -> list[SpeechEvent]:
        """Advance by the windows of one chunk; return the changes they caused, in order."""
        events: list[SpeechEvent] = []
        for probability in probabilities:
            self._windows += 1
            if self.speaking:
                self._run = self._run + 1 if probability < self.stop_threshold else 0
                if self._run >= self._stop_windows:
                    self.speaking, self._run = False, 0
                    events.append(SpeechEvent(SpeechEventKind.END, self._windows * WINDOW_MS))
            else:
                self._run = self._run + 1 if probability >= self.start_threshold else 0
                if self._run >= self._start_windows:
                    self.speaking, self._run = True, 0
                    events.append(SpeechEvent(SpeechEventKind.START, self._windows * WINDOW_MS))
        return events
