"""What a speak session has been asked to say: utterances, complete or still streaming in.

Each utterance is cut into sentences as its text arrives (``media.audio.text``), so the
first sentence can be synthesised while later text is still on its way.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from media.audio.text import SentenceSplitter

# Utterances waiting to be spoken, at most: with 4000 characters each, minutes of speech
# and a bounded amount of memory, however fast a client sends.
MAX_QUEUED_UTTERANCES = 64


class SpeechQueueFull(Exception):
    """A new utterance found ``MAX_QUEUED_UTTERANCES`` already waiting."""


@dataclass(eq=False)
class Utterance:
    """One thing to say: complete (``speak``) or growing piece by piece (``speak_delta``)."""

    id: str
    splitter: SentenceSplitter = field(default_factory=SentenceSplitter)
    sentences: deque[str] = field(default_factory=deque)
    closed: bool = False  # no more text will come
    more: asyncio.Event = field(default_factory=asyncio.Event)
    streamed: bool = False  # made of speak_delta pieces
    queued_at: float = 0.0  # loop time the first text arrived
    characters: int = 0  # text received so far
    synthesised: float = 0.0  # seconds of audio made so far
    start: int | None = None  # output stream position of the first sample
    end: int | None = None  # set once synthesis is complete
    started: bool = False
    finished: bool = False

    def add(self, text: str) -> None:
        self.characters += len(text)
        self.sentences.extend(self.splitter.feed(text))
        self.more.set()

    def close(self) -> None:
        self.sentences.extend(self.splitter.flush())
        self.closed = True
        self.more.set()

    async def next_sentence(self) -> str | None:
        """The next sentence to synthesise, waiting for text; None once closed and drained."""
        while not self.sentences:
            if self.closed:
                return None
            self.more.clear()
            await self.more.wait()
        return self.sentences.popleft()


class UtteranceQueue:
    """Utterances in the order they were asked for, with the one still taking deltas."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._waiting: deque[Utterance] = deque()
        self._queued = asyncio.Event()
        self._open_delta: Utterance | None = None
        self._next_id = 0
        self.added = 0

    def _new_id(self, requested: str | None) -> str:
        if requested is not None:
            return requested
        self._next_id += 1
        return f"u{self._next_id}"

    def speak(self, text: str, utterance_id: str | None = None) -> str:
        """Queue a complete utterance (spoken in full even without final punctuation)."""
        utterance = Utterance(self._new_id(utterance_id))
        utterance.add(text)
        utterance.close()
        self._enqueue(utterance)
        return utterance.id

    def speak_delta(self, piece: str, utterance_id: str | None = None) -> str:
        """Add a streamed piece; sentences are spoken as soon as their boundary arrives."""
        utterance = self._open_delta
        if utterance is None or (utterance_id is not None and utterance_id != utterance.id):
            if utterance is not None:
                utterance.close()
            utterance = Utterance(self._new_id(utterance_id), streamed=True)
            self._enqueue(utterance)
            self._open_delta = utterance
        utterance.add(piece)
        return utterance.id

    def flush(self, utterance_id: str | None = None) -> str | None:
        """Speak the rest of the streamed utterance; returns its id (None if there was none)."""
        utterance = self._open_delta
        if utterance is None or (utterance_id is not None and utterance_id != utterance.id):
            return None
        utterance.close()
        self._open_delta = None
        return utterance.id

    def _enqueue(self, utterance: Utterance) -> None:
        if len(self._waiting) >= MAX_QUEUED_UTTERANCES:
            raise SpeechQueueFull(f"{MAX_QUEUED_UTTERANCES} utterances are already waiting")
        utterance.queued_at = self._clock()
        self.added += 1
        self._waiting.append(utterance)
        self._queued.set()

    async def next(self) -> Utterance:
        """The oldest waiting utterance, waiting for one if there is none."""
        while not self._waiting:
            self._queued.clear()
            await self._queued.wait()
        return self._waiting.popleft()

    def drop_all(self) -> list[Utterance]:
        """Everything not yet started, waiting or still taking deltas, now given up."""
        dropped = list(self._waiting)
        self._waiting.clear()
        delta = self._open_delta
        if delta is not None and not delta.finished and delta not in dropped:
            dropped.append(delta)  # being spoken already, and still taking deltas
        self._open_delta = None
        return dropped

    def clear(self) -> None:
        self._waiting.clear()
        self._open_delta = None
