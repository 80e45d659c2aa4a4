"""The bridge between the event loop and a synthesis running in a worker thread.

``engine.synthesize`` is a blocking generator: it runs on the session's engine queue, and
each chunk it yields is handed to the loop as it comes (``call_soon_threadsafe``). The
thread pauses once ``room`` is cleared (the output holds enough speech ahead) and stops at
the next chunk once ``cancel`` is set (an interrupt), so an interrupted utterance stops
costing CPU within one chunk.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any

import numpy as np

from media.engines.base import SpeakEngine
from media.pipeline.speak.stats import SpeakStats
from media.pipeline.speak.utterances import Utterance

ROOM_CHECK_SECONDS = 0.5  # how often a paused synthesis looks for a cancel

ChunkSink = Callable[[Utterance, np.ndarray, float], None]  # utterance, chunk, engine seconds


class SynthesisBridge:
    """Runs one utterance at a time through the engine and passes its chunks to the loop."""

    def __init__(
        self,
        engine: SpeakEngine[Any],
        engine_calls: Executor,
        stats: SpeakStats,
        accept: ChunkSink,
    ) -> None:
        self._engine = engine
        self._engine_calls = engine_calls
        self._stats = stats
        self._accept = accept
        self.cancel = threading.Event()
        self.room = threading.Event()
        self.room.set()

    async def speak(self, utterance: Utterance, state: Any) -> None:
        """Synthesise ``utterance`` until it ends or ``cancel`` is set; engine errors raise.

        A streamed utterance goes to the engine in one context when the engine reads text
        as it arrives; otherwise it is spoken sentence by sentence, like a whole one.
        """
        loop = asyncio.get_running_loop()
        if utterance.streamed and self._engine.capabilities.incremental_text:
            await loop.run_in_executor(
                self._engine_calls, self._synthesise_streamed, loop, utterance, state
            )
            return
        while not self.cancel.is_set():
            sentence = await utterance.next_sentence()
            if sentence is None or self.cancel.is_set():
                return
            await loop.run_in_executor(
                self._engine_calls, self._synthesise_sentence, loop, utterance, state, sentence
            )

    def _synthesise_sentence(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance, state: Any, sentence: str
    ) -> None:
        """Runs in a worker thread: one sentence, chunk by chunk."""
        self._stats.sentences += 1
        chunks = self._engine.synthesize(state, sentence, self.cancel)
        self._stream_chunks(loop, utterance, chunks)

    def _synthesise_streamed(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance, state: Any
    ) -> None:
        """Runs in a worker thread: a streamed utterance in one model context.

        The thread waits for text as well as for the model, so only engines that read text
        incrementally take this path; others get one sentence at a time.
        """
        sentences = self._sentences_as_they_come(loop, utterance)
        self._stats.sentences += 1
        self._stream_chunks(
            loop, utterance, self._engine.synthesize_pieces(state, sentences, self.cancel)
        )

    def _sentences_as_they_come(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance
    ) -> Iterator[str]:
        """Runs in a worker thread: blocks for each sentence the loop's splitter completes."""
        while not self.cancel.is_set():
            sentence = asyncio.run_coroutine_threadsafe(utterance.next_sentence(), loop).result()
            if sentence is None or self.cancel.is_set():
                return
            yield sentence

    def _stream_chunks(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance, chunks: Iterator[np.ndarray]
    ) -> None:
        """Hand chunks to the loop as they come, pausing when far ahead; stop on cancel."""
        while True:
            began = time.perf_counter()
            chunk = next(chunks, None)
            spent = time.perf_counter() - began
            self._stats.synthesis_seconds += spent
            if chunk is None or self.cancel.is_set():
                return
            self._stats.synthesised_seconds += len(chunk) / self._engine.sample_rate
            loop.call_soon_threadsafe(self._accept, utterance, chunk, spent)
            while not self.room.wait(timeout=ROOM_CHECK_SECONDS):
                if self.cancel.is_set():
                    return

    def stop(self) -> None:
        """Cancel what runs and wake a thread waiting for room, so it sees the cancel."""
        self.cancel.set()
        self.room.set()
