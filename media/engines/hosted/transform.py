"""A transform engine whose model runs in the model host: the worker keeps no weights.

Each chunk of a session's audio (one 20 ms frame) goes to the host in a ``hop`` message
and the engine's output comes back in ``out``: on the server loop's own channel to the host
(``hop_channel``), or through the link's thread until that channel is up (and for callers
off a loop). The host hands the chunk to its engine's own batch loop, so the sessions of
every worker share its steps. ``submit`` never blocks: the transform pipeline awaits the
future on its loop, as it does for a batched engine in the worker, and no thread waits per
session.

When the host goes away, the chunk in flight (or, with none, the next one) fails once: the
pipeline plays silence for it, reports one ``error`` event and resets the state. Until a
host answers again the session's audio passes through unprocessed, delayed by the
engine's delay so that the timing does not jump when processing resumes; meanwhile the
state is opened again on the new host in the background, without blocking the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from media.engines.base import (
    BatchedTransformEngine,
    Capabilities,
    ChunkFuture,
    EngineError,
    EngineKind,
    EngineUnavailable,
)
from media.engines.hosted.description import option_spec
from media.engines.hosted.hop_channel import HopChannel
from media.engines.hosted.link import HostLink, HostRefused

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
# A state the host lost is opened again at most this often while the link is up.
REOPEN_EVERY_S = 0.5


@dataclass(eq=False)
class HostedTransformState:
    """One session: its options, its state on the host (per link generation), and what
    plays while there is none."""

    options: dict[str, Any]
    delay: np.ndarray  # the pass-through's delay line: the engine's delay of audio
    host_state: int | None = None
    generation: int = 0  # the link generation ``host_state`` belongs to
    reported: bool = False  # the loss of the host state was reported (one error per loss)
    reopening: Future[Any] | None = field(default=None, repr=False)
    reopened_at: float = -1e9  # when a re-open was last tried
    closed: bool = False


class HostedTransformEngine(BatchedTransformEngine[HostedTransformState]):
    """A transform engine of the model host, served in this worker over ``link``."""

    def __init__(self, link: HostLink, described: Mapping[str, Any]) -> None:
        self.link = link
        super().__init__(
            name=str(described["name"]),
            kind=EngineKind.TRANSFORM,
            sample_rate=int(described["sample_rate"]),
            hop_size=int(described["hop_size"]),
            delay_ms=float(described["delay_ms"]),
            description=str(described["description"]),
            option_specs=tuple(option_spec(option) for option in described["options"]),
            capabilities=Capabilities(batched=True, own_compute=True),
        )
        self._delay_samples = round(self.delay_ms * self.sample_rate / 1000)
        self._channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HopChannel] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def unavailable_reason(self) -> str | None:
        return self.link.unavailable_reason

    def new_state(self, options: Mapping[str, Any]) -> HostedTransformState:
        """Open the session's state on the host (a pipeline thread: it waits for the host).

        Raises ``EngineUnavailable`` when the host refuses or is not there: the session is
        not admitted, nothing is left half open.
        """
        state = HostedTransformState(dict(options), np.zeros(self._delay_samples, np.float32))
        try:
            self._open(state)
        except HostRefused as exc:
            raise EngineUnavailable(f"on the model host: {exc}") from exc
        return state

    def submit(self, state: HostedTransformState, chunk: np.ndarray) -> ChunkFuture:
        if self._current(state):
            assert state.host_state is not None
            channel = self._channel()
            if channel is not None and channel.ready(state.generation):
                return channel.hop(state.host_state, chunk)
            return self.link.hop(state.host_state, state.generation, chunk)
        if not state.reported:  # the first chunk after the loss fails: one error event
            state.reported = True
            return _failed(
                EngineUnavailable(self.link.unavailable_reason or "the model host restarted")
            )
        self._reopen_soon(state)
        return _done(self._pass_through(state, chunk))

    def reset_state(
        self, state: HostedTransformState, options: Mapping[str, Any]
    ) -> HostedTransformState:
        """After a failed chunk: a fresh state on the host (the same one, reset, where it
        still exists), or none until the host is back. Never raises: the session goes on."""
        state.reported = True
        try:
            if self._current(state):
                self.link.request(
                    {"t": "reset", "state": state.host_state}, timeout=REQUEST_TIMEOUT_S
                )
            elif self.link.unavailable_reason is None:
                self._open(state)
        except EngineError as exc:
            log.info(
                "a hosted %s state could not be reset (%s); it is opened again", self.name, exc
            )
            state.host_state = None
        return state

    def flush(self, state: HostedTransformState) -> np.ndarray:
        """The host's engine keeps what is short of a hop; the stream ends there."""
        return np.zeros(0, np.float32)

    def close_state(self, state: HostedTransformState) -> None:
        state.closed = True
        if self._current(state):
            self.link.send({"t": "close", "state": state.host_state})

    def close(self) -> None:
        for loop, channel in list(self._channels.items()):
            with contextlib.suppress(RuntimeError):  # that loop is closed: so is its channel
                loop.call_soon_threadsafe(channel.close)
        self.link.close()

    # --- the host state ----------------------------------------------------------------

    def _channel(self) -> HopChannel | None:
        """The running loop's channel to the host (None off a loop: the link's way)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        channel = self._channels.get(loop)
        if channel is None:
            channel = self._channels[loop] = HopChannel(self.link, loop)
        return channel

    def _current(self, state: HostedTransformState) -> bool:
        return (
            state.host_state is not None
            and state.generation == self.link.generation
            and self.link.unavailable_reason is None
        )

    def _open(self, state: HostedTransformState) -> None:
        request = {"t": "open", "engine": self.name, "options": state.options}
        reply, generation = self.link.request(request, timeout=REQUEST_TIMEOUT_S)
        state.host_state, state.generation = int(reply["state"]), generation
        state.reported = False

    def _reopen_soon(self, state: HostedTransformState) -> None:
        """Open the state on the host in the background (from the server's loop)."""
        now = time.monotonic()
        if (
            state.reopening is not None
            or self.link.unavailable_reason is not None
            or now - state.reopened_at < REOPEN_EVERY_S
        ):
            return
        state.reopened_at = now
        request = {"t": "open", "engine": self.name, "options": state.options}
        state.reopening = self.link.request_soon(request, timeout=REQUEST_TIMEOUT_S)
        state.reopening.add_done_callback(lambda done: self._reopened(state, done))

    def _reopened(self, state: HostedTransformState, done: Future[Any]) -> None:
        state.reopening = None
        if done.cancelled() or done.exception() is not None:
            log.info("a hosted %s state could not be opened again: %s", self.name, done.exception())
            return
        reply, generation = done.result()
        if state.closed:  # the session ended meanwhile: its new state is nobody's
            self.link.send({"t": "close", "state": int(reply["state"])})
            return
        state.host_state, state.generation = int(reply["state"]), generation
        state.reported = False

    def _pass_through(self, state: HostedTransformState, chunk: np.ndarray) -> np.ndarray:
        """The session's own audio, as late as the engine's output would be."""
        line = np.concatenate([state.delay, np.asarray(chunk, np.float32)])
        state.delay = line[len(line) - self._delay_samples :].copy()
        return line[: len(line) - self._delay_samples]


def _done(value: np.ndarray) -> Future[np.ndarray]:
    future: Future[np.ndarray] = Future()
    future.set_result(value)
    return future


def _failed(error: Exception) -> Future[np.ndarray]:
    future: Future[np.ndarray] = Future()
    future.set_exception(error)
    return future
