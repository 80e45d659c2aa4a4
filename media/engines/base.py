"""The engine protocol: what every streaming model looks like to the media path.

An engine is loaded once per process and shared by every session. Everything that belongs to
one stream (recurrent state, buffered samples, native handles) lives in a per-session state
object made by ``new_state``, so the weights are shared and the streams never are.

Transforms are driven as ``out, state = engine.process(state, chunk)``: chunks are float32
mono at ``engine.sample_rate`` and may have any length; an engine with a fixed hop buffers
the remainder in its state and returns as many samples as it could produce.
"""

from __future__ import annotations

import asyncio
import enum
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

StateT = TypeVar("StateT")
# What a batched transform's ``submit`` returns: see BatchedTransformEngine.submit.
ChunkFuture = Future[np.ndarray] | asyncio.Future[np.ndarray]


class EngineKind(enum.StrEnum):
    """What goes in and what comes out of an engine."""

    TRANSFORM = "transform"  # audio in, audio out
    SPEAK = "speak"  # text in, audio out


class EngineError(Exception):
    """Base class for errors an engine reports to its caller."""


class OptionsError(EngineError):
    """Session options that do not match the engine's schema; the message names the option."""


class EngineUnavailable(EngineError):
    """The engine cannot load here: the message says what to install or which path to set."""


@dataclass(frozen=True)
class OptionSpec:
    """One session option, served as a JSON-schema property by ``GET /engines``."""

    name: str
    type: str  # "number", "integer", "boolean" or "string"
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None

    def schema(self) -> dict[str, Any]:
        prop: dict[str, Any] = {
            "type": self.type,
            "default": self.default,
            "description": self.description,
        }
        if self.minimum is not None:
            prop["minimum"] = self.minimum
        if self.maximum is not None:
            prop["maximum"] = self.maximum
        if self.choices is not None:
            prop["enum"] = list(self.choices)
        return prop

    def coerce(self, value: Any) -> Any:
        """Check one supplied value against the spec and return it in its canonical type."""
        if self.type == "boolean":
            if not isinstance(value, bool):
                raise OptionsError(f"option '{self.name}' must be true or false")
            return value
        if self.type in ("number", "integer"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise OptionsError(f"option '{self.name}' must be a number")
            # Finite first (int() of inf or NaN raises); a Python int always is, however
            # large, where np.isfinite refuses one past 64 bits.
            if isinstance(value, float) and not math.isfinite(value):
                raise OptionsError(f"option '{self.name}' must be finite")
            if self.type == "integer" and int(value) != value:
                raise OptionsError(f"option '{self.name}' must be an integer")
            if self.minimum is not None and value < self.minimum:
                raise OptionsError(f"option '{self.name}' must be >= {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise OptionsError(f"option '{self.name}' must be <= {self.maximum}")
            return int(value) if self.type == "integer" else float(value)
        if not isinstance(value, str):
            raise OptionsError(f"option '{self.name}' must be a string")
        if self.choices is not None and value not in self.choices:
            raise OptionsError(f"option '{self.name}' must be one of {', '.join(self.choices)}")
        return value


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond its kind's protocol, declared instead of probed."""

    # speak: reads text as it arrives, in one model context (``synthesize_pieces``).
    incremental_text: bool = False
    # takes a voice clip to speak or convert in (``set_prompt``).
    voice_prompt: bool = False
    # runs many sessions' hops as one model call (the tick scheduler drives it).
    batched: bool = False
    # speak: ``synthesize`` computes on the engine's own worker (a batch thread, a remote
    # server) and the calling thread only waits for its chunks.
    own_compute: bool = False
    # speak: that worker computes on the process's CPU cores, in a loop sharing the GIL with
    # whatever else the process runs; a media worker then hands it no more utterances at
    # once than it has engine threads (the model host, which runs no media, hands it all).
    compute_on_cpu: bool = False
    # speak: the languages it speaks (ISO 639 codes); text in other scripts is refused.
    languages: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "incremental_text": self.incremental_text,
            "voice_prompt": self.voice_prompt,
            "batched": self.batched,
        }


@dataclass
class Engine(ABC, Generic[StateT]):
    """A model loaded once per process; sessions talk to it only through their own state."""

    name: str
    kind: EngineKind
    sample_rate: int
    hop_size: int
    delay_ms: float
    description: str
    option_specs: tuple[OptionSpec, ...] = field(default=())
    # True when a call costs a few microseconds, so running it in a worker thread would cost
    # more (the thread handoff) than the work itself. Such engines run on the event loop.
    runs_inline: bool = False
    capabilities: Capabilities = field(default=Capabilities())

    @property
    def unavailable_reason(self) -> str | None:
        """Why the engine takes no new sessions right now (a remote server it cannot reach),
        or None while it does. Asked at every admission; live sessions are not affected."""
        return None

    def validate_options(self, raw: Mapping[str, Any] | None) -> dict[str, Any]:
        """Return the complete option set: defaults overlaid with the supplied values."""
        raw = raw or {}
        specs = {spec.name: spec for spec in self.option_specs}
        unknown = sorted(set(raw) - set(specs))
        if unknown:
            known = ", ".join(specs) or "none"
            raise OptionsError(
                f"unknown option '{unknown[0]}' for engine '{self.name}' (known: {known})"
            )
        options = {name: spec.default for name, spec in specs.items()}
        for name, value in raw.items():
            options[name] = specs[name].coerce(value)
        return options

    def describe(self) -> dict[str, Any]:
        """The engine as ``GET /engines`` serves it."""
        return {
            "name": self.name,
            "kind": self.kind.value,
            "description": self.description,
            "sample_rate": self.sample_rate,
            "hop_size": self.hop_size,
            "delay_ms": self.delay_ms,
            "capabilities": self.capabilities.describe(),
            "languages": list(self.capabilities.languages),
            "options": {
                "type": "object",
                "additionalProperties": False,
                "properties": {spec.name: spec.schema() for spec in self.option_specs},
            },
        }

    @abstractmethod
    def new_state(self, options: Mapping[str, Any]) -> StateT:
        """A fresh per-session state for already validated options."""

    def close_state(self, state: StateT) -> None:
        """Release what a state holds outside the Python heap; called once per state."""

    def set_prompt(self, state: StateT, audio: np.ndarray, rate: int, transcript: str) -> None:
        """Speak (or convert) in the voice of ``audio`` from now on (``voice_prompt`` only).

        Raises ``ValueError`` saying what is wrong with the clip.
        """
        raise EngineError(f"engine '{self.name}' takes no voice prompt")

    def close(self) -> None:
        """Release what the engine holds for the whole process (weights, pools, threads)."""


class TransformEngine(Engine[StateT]):
    """Audio in, audio out, one chunk at a time, with all stream memory in the state."""

    @abstractmethod
    def process(self, state: StateT, chunk: np.ndarray) -> tuple[np.ndarray, StateT]:
        """Consume ``chunk`` (float32 mono) and return the audio ready so far."""

    @abstractmethod
    def flush(self, state: StateT) -> np.ndarray:
        """Return what is still held inside the state at the end of a stream."""

    def reset_state(self, state: StateT, options: Mapping[str, Any]) -> StateT:
        """Replace a state after an error: the session survives, the stream gets a short gap."""
        self.close_state(state)
        return self.new_state(options)


class BatchedTransformEngine(TransformEngine[StateT]):
    """A transform whose sessions share one model call per hop (``capabilities.batched``).

    ``submit`` hands a chunk to the engine's tick scheduler (``media.engines.batching``)
    and returns at once; the future gets the output when the chunk's hops have run in
    batched steps with other sessions'. Nothing blocks a thread per session while it waits.
    ``process`` is the plain protocol on top of it, for callers outside a pipeline: it waits.
    """

    @abstractmethod
    def submit(self, state: StateT, chunk: np.ndarray) -> ChunkFuture:
        """Queue ``chunk`` (float32 mono); the future gets the audio ready so far.

        Called on an event loop, it may return an ``asyncio`` future of that loop (an
        engine whose answers that loop reads); called elsewhere, a thread-safe one.
        """

    def process(self, state: StateT, chunk: np.ndarray) -> tuple[np.ndarray, StateT]:
        future = self.submit(state, chunk)
        assert isinstance(future, Future), "process() waits: it is not called on a loop"
        return future.result(), state


class SpeakEngine(Engine[StateT]):
    """Text in, audio out: synthesis streams chunks as the model produces them.

    ``synthesize`` runs in a worker thread. It must yield float32 mono chunks at
    ``sample_rate`` as soon as each is ready (the first one long before the whole text is
    done) and check ``cancel`` between chunks, returning promptly once it is set, so an
    interrupted utterance stops costing CPU within one chunk.
    """

    @abstractmethod
    def synthesize(self, state: StateT, text: str, cancel: threading.Event) -> Iterator[np.ndarray]:
        """Yield the audio of ``text`` chunk by chunk until done or cancelled."""

    def synthesize_pieces(
        self, state: StateT, pieces: Iterator[str], cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        """Speak text that is still arriving as one utterance (``incremental_text`` engines:
        CosyVoice2's bistream reads it in one context; others get one sentence at a time).

        ``pieces`` blocks until the next sentence arrives and ends when the text does.
        """
        raise EngineError(f"engine '{self.name}' reads whole sentences only")


# Options every speak session has, whatever its engine; engines add them to their specs.
BARGE_IN_OPTION = OptionSpec(
    "barge_in",
    "boolean",
    True,
    "Stop speaking when the caller starts talking (the server's own voice is echo-cancelled).",
)
