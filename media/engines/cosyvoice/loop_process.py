"""A batch loop in a process of its own, so that a CPU's second core speaks too.

One batch loop (``batcher.py``) computes on one thread, and on a CPU one thread is one core.
A second loop as a second thread of the same process made first audio worse, not better
(tiny model, 2 cores, 8 utterances started together, split over two loops: first chunk p50
2.2x -> 3.0x one utterance's, the loops' Python and the per-op dispatch wait on one GIL), so
every loop after the first runs in a process of its own (``python -m`` this module, not a
fork, which would copy the host's threads' locks, nor multiprocessing's spawn, which re-runs
the parent's main script), that loads the same model settings and runs one batcher.

The engine places each utterance on its least-loaded loop (``CosyVoiceEngine``), and an
utterance here looks to it like one in the process's own batcher: ``audio()`` yields its
chunks, ``left`` is set once the listener is gone. What crosses the pipe per utterance is its
request, its voice prompt and its random generator's state, then one message per rendered
chunk (a hop, 0.4-4 s of audio, not a 20 ms frame) and, at the end, the generator's state,
written back into the session's generator: a seeded session draws the same tokens wherever
its utterances run (the vocoder's excitation noise comes from each process's torch
generator, in one process as in several). A cancel (or the listener leaving) is sent on
within ``WATCH_S``; the loop drops the utterance at its next step. If the process dies, its
utterances end with ``LlmFailed``, the engine places no more on it and starts another in its
place.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

from media.engines.cosyvoice.batcher import END_OF_AUDIO, DeliveredAudio
from media.engines.cosyvoice.prompts import SpeakerPrompt
from media.engines.cosyvoice.schedule import HopSchedule
from media.engines.cosyvoice.tokens import LlmFailed, LlmRequest

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a spawned process imports torch and loads the model
WATCH_S = 0.01  # how often cancels are looked for, while there are utterances
STOP_JOIN_S = 5.0


@dataclass(eq=False)
class RemoteUtterance(DeliveredAudio):
    """One utterance placed on a loop process, as the engine sees it; the process ends its
    audio within a step of a cancel reaching it, or this end fails it if the process dies."""

    generator: torch.Generator
    cancel: threading.Event
    output: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    left: threading.Event = field(default_factory=threading.Event)
    stop_sent: bool = False


class LoopProcess:
    """The parent's end of one loop process: places utterances there and relays its audio."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = dict(values)  # the engine's settings, for a replacement
        ours, theirs = socket.socketpair()
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=environment,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._busy = threading.Condition(self._lock)  # there are utterances to watch
        self._utterances: dict[int, RemoteUtterance] = {}
        self._ids = itertools.count(1)
        self._alive = False
        self._closed = threading.Event()
        self._send(("load", 0, dict(values)))

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Block until the process has loaded and warmed up its model; raise if it failed."""
        if not self._conn.poll(timeout):
            self.close()
            raise LlmFailed(f"a CosyVoice loop process was not ready within {timeout:.0f} s")
        try:
            kind, detail = _receive(self._conn)
        except (EOFError, OSError) as exc:
            self.close()
            raise LlmFailed("a CosyVoice loop process exited while loading") from exc
        if kind != "ready":
            self.close()
            raise LlmFailed(f"a CosyVoice loop process failed to load: {detail}")
        self._alive = True
        threading.Thread(target=self._read, name="cosyvoice-loop-read", daemon=True).start()
        threading.Thread(target=self._watch, name="cosyvoice-loop-watch", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._utterances)

    def speak(
        self,
        request: LlmRequest,
        prompt: SpeakerPrompt,
        generator: torch.Generator,
        schedule: HopSchedule,
        cancel: threading.Event,
    ) -> RemoteUtterance:
        utterance = RemoteUtterance(generator, cancel)
        job = pickle.dumps((request, prompt, generator.get_state(), schedule))
        with self._lock:
            if not self._alive:
                raise LlmFailed("the CosyVoice loop process has stopped")
            number = next(self._ids)
            self._utterances[number] = utterance
            self._busy.notify()
        try:
            self._send(("speak", number, job))
        except OSError as exc:
            self._lost(exc)
        return utterance

    def close(self) -> None:
        self._closed.set()
        with self._busy:
            self._alive = False
            self._busy.notify()
        if self._process.poll() is None:
            try:
                self._send(("close", 0, None))
                self._process.wait(STOP_JOIN_S)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait(STOP_JOIN_S)
        self._conn.close()

    def _send(self, message: tuple[str, int, Any]) -> None:
        with self._send_lock:
            self._conn.send_bytes(pickle.dumps(message))

    def _read(self) -> None:
        while True:
            try:
                kind, number, detail = _receive(self._conn)
            except (EOFError, OSError) as exc:
                self._lost(exc)
                return
            with self._lock:
                utterance = self._utterances.get(number)
                if utterance is not None and kind != "chunk":
                    del self._utterances[number]
            if utterance is None:
                continue
            if kind == "chunk":
                utterance.output.put(detail)
            elif kind == "end":
                if not utterance.stopped:  # a cancelled one's next utterance may have begun
                    utterance.generator.set_state(detail)
                utterance.output.put(END_OF_AUDIO)
            else:
                utterance.output.put(LlmFailed(f"speech synthesis failed: {detail}"))

    def _watch(self) -> None:
        """Send on the cancels, looking every ``WATCH_S`` while there are utterances (an idle
        thread that woke 100 times a second would take the GIL from the batch loop here)."""
        while not self._closed.wait(WATCH_S):
            with self._busy:
                self._busy.wait_for(lambda: bool(self._utterances) or not self._alive)
                if not self._alive:
                    return
                stopping = [
                    (number, utterance)
                    for number, utterance in self._utterances.items()
                    if utterance.stopped and not utterance.stop_sent
                ]
            for number, utterance in stopping:
                utterance.stop_sent = True
                try:
                    self._send(("stop", number, None))
                except OSError:
                    return

    def _lost(self, cause: BaseException) -> None:
        """The process is gone: end what it held, and take no more."""
        with self._busy:
            was_alive, self._alive = self._alive, False
            lost, self._utterances = list(self._utterances.values()), {}
            self._busy.notify()
        if was_alive and not self._closed.is_set():
            log.warning("a CosyVoice loop process (pid %s) exited: %s", self.pid, cause)
        for utterance in lost:
            utterance.output.put(LlmFailed("the CosyVoice loop process running it exited"))


def _receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def serve_loop(conn: Connection) -> None:
    """The loop process: load the model as the engine's settings say, then run utterances."""
    try:
        _, _, values = _receive(conn)
        from media.engines.cosyvoice.loader import load_batched_engine

        engine = load_batched_engine(values)
    except Exception as exc:  # reported to the parent, which refuses to start
        conn.send_bytes(pickle.dumps(("failed", f"{type(exc).__name__}: {exc}")))
        return
    conn.send_bytes(pickle.dumps(("ready", None)))
    batcher = engine.batcher
    send_lock = threading.Lock()
    cancels: dict[int, threading.Event] = {}

    def send(message: tuple[str, int, Any]) -> None:
        with send_lock:
            conn.send_bytes(pickle.dumps(message))

    def relay(number: int, job: bytes) -> None:
        try:
            request, prompt, state, schedule = pickle.loads(job)
            generator = torch.Generator()
            generator.set_state(state)
            utterance = batcher.speak(request, prompt, generator, schedule, cancels[number])
            for chunk in utterance.audio():
                send(("chunk", number, chunk))
            send(("end", number, generator.get_state()))
        except OSError:
            return  # the parent is gone
        except Exception as exc:
            try:
                send(("error", number, str(exc)))
            except OSError:
                return
        finally:
            cancels.pop(number, None)

    try:
        while True:
            try:
                kind, number, detail = _receive(conn)
            except (EOFError, OSError):
                break
            if kind == "close":
                break
            if kind == "speak":
                cancels[number] = threading.Event()
                threading.Thread(target=relay, args=(number, detail), daemon=True).start()
            elif kind == "stop" and number in cancels:
                cancels[number].set()
    finally:
        for cancel in list(cancels.values()):
            cancel.set()
        engine.shutdown()


if __name__ == "__main__":
    serve_loop(Connection(int(sys.argv[1])))
