"""One utterance on the host: its synthesis driven a chunk at a time, its audio sent on.

The engine's ``synthesize`` is a blocking generator, driven here as the speak pipeline
drives it in a worker: each ``next()`` is one call on the session's serial queue, so a
thread is given back between chunks and the host's threads go to what matters most across
every worker's sessions:

- an engine with a batch loop of its own (``own_compute``: CosyVoice's batcher) gets every
  utterance's calls on the pool's waiting threads at once, so all of them are in its batch
  (in a worker, on a CPU, the engine threads cap them, as the batch loop shares the
  worker's GIL with its calls' media; the host has no media);
- any other engine's first chunk is URGENT (someone hears nothing yet), and later chunks
  go by deadline: the moment the listener would run out of the audio sent so far, had it
  started playing when the first chunk was sent.

Credit: the host stays at most ``AHEAD_S`` of audio ahead of what the worker's reader has
taken (``took``), so a session that stops listening stops costing compute here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np

from media.engines.base import SpeakEngine
from media.pipeline.executor import URGENT, SerialExecutor

AHEAD_S = 4.0

SendAudio = Callable[[np.ndarray], Awaitable[None]]


class HostedUtterance:
    """The synthesis of ``text`` in ``state``, until it ends, fails or is cancelled."""

    def __init__(
        self,
        engine: SpeakEngine[Any],
        state: Any,
        calls: SerialExecutor,
        text: str,
        send: SendAudio,
    ) -> None:
        self._engine = engine
        self._state = state
        self._calls = calls
        self._text = text
        self._send = send
        self.cancel = threading.Event()
        self._credit = asyncio.Event()
        self._ahead = int(AHEAD_S * engine.sample_rate)
        self.sent = 0  # samples sent to the worker
        self.taken = 0  # samples its reader has taken

    def took(self, samples: int) -> None:
        self.taken = max(self.taken, samples)
        self._credit.set()

    def stop(self) -> None:
        self.cancel.set()
        self._credit.set()

    async def run(self) -> None:
        """Synthesise and send; the engine's errors raise."""
        chunks: list[Iterator[np.ndarray]] = []

        def step() -> np.ndarray | None:
            if not chunks:
                chunks.append(iter(self._engine.synthesize(self._state, self._text, self.cancel)))
            return next(chunks[0], None)

        own_compute = self._engine.capabilities.own_compute
        rate = self._engine.sample_rate
        playing_since: float | None = None
        try:
            while not self.cancel.is_set():
                if own_compute:
                    call = self._calls.submit_waiting(step)
                elif playing_since is None:
                    call = self._calls.submit_at(URGENT, step)
                else:
                    call = self._calls.submit_by(playing_since + self.sent / rate, step)
                chunk = await asyncio.wrap_future(call)
                if chunk is None or self.cancel.is_set():
                    return
                if playing_since is None:
                    playing_since = time.monotonic()
                await self._send(chunk)
                self.sent += len(chunk)
                while self.sent - self.taken > self._ahead and not self.cancel.is_set():
                    self._credit.clear()
                    await self._credit.wait()
        finally:
            closer = getattr(chunks[0], "close", None) if chunks else None
            if closer is not None:  # a generator left mid-way: its cleanup runs off the loop
                self._calls.submit(closer)
