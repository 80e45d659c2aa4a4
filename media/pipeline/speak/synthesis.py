"""The bridge between the event loop and a synthesis running on the engine threads.

``engine.synthesize`` is a blocking generator. It is driven one chunk at a time: each
``next()`` is one call on the session's engine queue, at URGENT priority until the
utterance can start playing (its first chunk, and any more its pre-buffer waits for) and
NORMAL after that, so with many callers every caller's first audio is made before anyone's
later chunks, and a thread is given back between chunks. Chunks reach the output on the
loop as they come. Synthesis pauses while ``room`` is clear (the output holds enough
speech ahead) and stops at the next chunk once ``cancel`` is set (an interrupt): an
interrupted utterance stops costing CPU within one chunk.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from media.engines.base import SpeakEngine
from media.pipeline.executor import NORMAL, URGENT, SerialExecutor
from media.pipeline.speak.pace import engine_pace
from media.pipeline.speak.stats import SpeakStats
from media.pipeline.speak.utterances import Utterance

ChunkSink = Callable[[Utterance, np.ndarray, float], None]  # utterance, chunk, engine seconds
Waiting = Callable[[Utterance], bool]  # the utterance cannot start playing yet


class SynthesisBridge:
    """Runs one utterance at a time through the engine and passes its chunks to the loop."""

    def __init__(
        self,
        engine: SpeakEngine[Any],
        engine_calls: SerialExecutor,
        stats: SpeakStats,
        accept: ChunkSink,
        waiting: Waiting,
    ) -> None:
        self._engine = engine
        self._engine_calls = engine_calls
        self._stats = stats
        self._accept = accept
        self._waiting = waiting
        self._pace = engine_pace(engine)
        self.cancel = threading.Event()  # read by the engine between its model runs
        self.room = asyncio.Event()
        self.room.set()

    async def speak(self, utterance: Utterance, state: Any) -> None:
        """Synthesise ``utterance`` until it ends or ``cancel`` is set; engine errors raise.

        A streamed utterance goes to the engine in one context when the engine reads text
        as it arrives; otherwise it is spoken sentence by sentence, like a whole one.
        """
        loop = asyncio.get_running_loop()
        if utterance.streamed and self._engine.capabilities.incremental_text:
            self._stats.sentences += 1
            pieces = self._sentences_as_they_come(loop, utterance)
            await self._stream(
                utterance, lambda: self._engine.synthesize_pieces(state, pieces, self.cancel)
            )
            return
        capabilities = self._engine.capabilities
        elsewhere = capabilities.own_compute and not capabilities.compute_on_cpu
        while not self.cancel.is_set():
            sentence = await utterance.next_sentence()
            if sentence is None or self.cancel.is_set():
                return
            self._stats.sentences += 1
            await self._stream(utterance, self._sentence_synthesis(state, sentence), elsewhere)

    def _sentence_synthesis(self, state: Any, sentence: str) -> Callable[[], Iterator[np.ndarray]]:
        return lambda: self._engine.synthesize(state, sentence, self.cancel)

    def _sentences_as_they_come(
        self, loop: asyncio.AbstractEventLoop, utterance: Utterance
    ) -> Iterator[str]:
        """Runs in a worker thread: blocks for each sentence the loop's splitter completes."""
        while not self.cancel.is_set():
            sentence = asyncio.run_coroutine_threadsafe(utterance.next_sentence(), loop).result()
            if sentence is None or self.cancel.is_set():
                return
            yield sentence

    async def _stream(
        self,
        utterance: Utterance,
        start: Callable[[], Iterator[np.ndarray]],
        elsewhere: bool = False,
    ) -> None:
        """Drive the synthesis ``start`` makes, a chunk per engine call, pausing when far
        ahead; stop on cancel. The iterator is made and closed on the engine queue too; with
        ``elsewhere`` (the engine computes on its own worker) its chunks are waited for on
        the pool's waiting threads, not on an engine thread."""
        chunks: list[Iterator[np.ndarray]] = []

        def step() -> tuple[np.ndarray | None, float]:
            began = time.perf_counter()
            if not chunks:
                chunks.append(iter(start()))
            chunk = next(chunks[0], None)
            return chunk, time.perf_counter() - began

        made = 0
        try:
            while True:
                if elsewhere:
                    call = self._engine_calls.submit_waiting(step)
                else:
                    priority = URGENT if self._waiting(utterance) else NORMAL
                    call = self._engine_calls.submit_at(priority, step)
                chunk, spent = await asyncio.wrap_future(call)
                self._stats.synthesis_seconds += spent
                if chunk is None or self.cancel.is_set():
                    return
                audio = len(chunk) / self._engine.sample_rate
                self._stats.synthesised_seconds += audio
                if made:  # past the sentence's first chunk and its fixed costs
                    self._stats.steady_synthesis_seconds += spent
                    self._stats.steady_synthesised_seconds += audio
                    self._pace.observe(spent, audio)
                made += 1
                self._accept(utterance, chunk, spent)
                while not self.room.is_set() and not self.cancel.is_set():
                    await self.room.wait()
                if self.cancel.is_set():
                    return
        finally:
            closer = getattr(chunks[0], "close", None) if chunks else None
            if closer is not None:  # a generator left mid-way: its cleanup runs off the loop
                self._engine_calls.submit(closer)

    def stop(self) -> None:
        """Cancel what runs and wake a synthesis waiting for room, so it sees the cancel."""
        self.cancel.set()
        self.room.set()
