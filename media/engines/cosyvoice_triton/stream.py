"""One utterance on the server: one gRPC stream, its audio, and its cancellation.

``open`` starts the stream on the link's loop and returns at once; the synthesis thread
then takes 20 ms frames with ``next_frame``. The stream ends in one of four ways:

- the model's final response: the request side is closed and the call completes;
- a cancel (interrupt, hang-up, a closed generator): the call is cancelled, which closes the
  HTTP/2 stream; Triton cancels the request and the model sees it (``is_cancelled()`` in
  a Python backend) before its next chunk. The reader checks the session's cancel event at
  every response and the waiting thread every ``CANCEL_CHECK_S``, whichever comes first;
- a server error (the model raised, a bad request): raised to the synthesis thread as
  :class:`RemoteSynthesisFailed`;
- the server lost (``UNAVAILABLE``): raised as :class:`~media.engines.base.EngineUnavailable`,
  and the link starts reconnecting.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from media.engines.base import EngineError, EngineUnavailable
from media.engines.cosyvoice_triton.contract import read_response
from media.engines.cosyvoice_triton.link import TritonLink
from media.engines.streamed_frames import FrameQueue, NoAudioInTime

# Status codes that mean the server (or the way to it) is gone, not that this request failed.
LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})


class RemoteSynthesisFailed(EngineError):
    """The server refused or failed the request; the message is the server's."""


class RemoteStream:
    """The audio of one request, streamed from the server into a bounded frame queue."""

    def __init__(
        self,
        link: TritonLink,
        request: service_pb2.ModelInferRequest,
        cancel: threading.Event,
        frame: int,
        limit: int,
    ) -> None:
        self._link = link
        self._request = request
        self._cancel = cancel
        self.frames = FrameQueue(frame, limit, link.loop)
        self._call: grpc.aio.StreamStreamCall | None = None
        self._done: asyncio.Event | None = None
        self._closed = False
        self._finished = False  # the model's final response came
        self.cancelled = False  # the stream was closed before the model's final response

    @classmethod
    def open(
        cls,
        link: TritonLink,
        request: service_pb2.ModelInferRequest,
        cancel: threading.Event,
        frame: int,
        limit: int,
    ) -> RemoteStream:
        stream = cls(link, request, cancel, frame, limit)
        link.submit(stream._run())
        return stream

    # --- the synthesis thread --------------------------------------------------------------

    def next_frame(self, timeout: float) -> np.ndarray | None:
        """The next 20 ms (the last one shorter), None at the end or on cancel.

        Raises ``RemoteSynthesisFailed``, ``EngineUnavailable`` or ``NoAudioInTime``.
        """
        try:
            frame = self.frames.take(self._cancel, timeout)
        except NoAudioInTime:
            self.close()
            raise
        if frame is None:
            self.close()
        return frame

    def close(self) -> None:
        """Stop reading and close the stream if it is still open (any thread, idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.frames.end()
        self._link.call_soon(self._stop)

    # --- the loop --------------------------------------------------------------------------

    def _stop(self) -> None:
        """Cancel the call unless the model has finished: the server sees the stream close."""
        call = self._call
        if not self._finished and call is not None and not call.done():
            self.cancelled = True
            call.cancel()
        if self._done is not None:
            self._done.set()

    async def _requests(self) -> AsyncIterator[service_pb2.ModelInferRequest]:
        """The one request, then an open request side until the stream is over."""
        assert self._done is not None
        yield self._request
        await self._done.wait()

    async def _run(self) -> None:
        self._done = asyncio.Event()
        if self._closed:
            return
        try:
            self._call = self._link.stub().ModelStreamInfer(self._requests())
            await self._read(self._call)
        except ConnectionError as exc:
            self.frames.end(EngineUnavailable(str(exc)))
        except grpc.aio.AioRpcError as exc:
            self._failed(exc)
        except asyncio.CancelledError:
            if not self._closed:  # the link is shutting down, not our own cancel
                self.frames.end(EngineUnavailable("the engine was closed mid-utterance"))
                raise
        finally:
            self._done.set()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        async for message in call:
            if self._cancel.is_set() or self._closed:
                self._closed = True
                self.frames.end()
                self._stop()
                return
            response = read_response(message)
            if response.error is not None:
                self.frames.end(RemoteSynthesisFailed(f"the server failed: {response.error}"))
                return
            if response.audio is not None:
                await self.frames.put(response.audio)
            if response.final:
                self._finished = True
                self.frames.end()
                return  # ``_run`` closes the request side and the call completes
        if not self._closed:
            self.frames.end(RemoteSynthesisFailed("the server ended the stream early"))

    def _failed(self, error: grpc.aio.AioRpcError) -> None:
        if error.code() == grpc.StatusCode.CANCELLED and self._closed:
            return  # our own cancel
        reason = f"{error.code().name}: {error.details() or 'no details'}"
        if error.code() in LOST_CODES:
            self._link.lost(reason)
            message = self._link.unavailable_reason or reason
            self.frames.end(EngineUnavailable(f"{message}; the utterance was cut short"))
        else:
            self.frames.end(RemoteSynthesisFailed(f"the stream failed ({reason})"))
