"""``POST /sessions/{id}/prompt``: a voice to clone, uploaded once per session.

The body is a WAV file (``audio/wav``, PCM 16-bit, any rate, mono or stereo) of 0.5-30 s of
speech; the ``transcript`` query parameter is what it says (the ``cosyvoice`` speak engine
needs it, ``cosyvoice-vc`` does not). The engine analyses the clip once, among the session's
own engine calls (never beside one of them, on the same state), and the session speaks (or
converts) in that voice from its next utterance on.

    curl -X POST -H 'Content-Type: audio/wav' --data-binary @me.wav \\
         "http://127.0.0.1:8080/sessions/$SESSION/prompt?transcript=Hello%20there"

"""

from __future__ import annotations

import io
import wave

import numpy as np
from aiohttp import web
from aiohttp.typedefs import Handler

from server.http.bodies import read_body
from server.http.routes import MAX_PROMPT_BYTES
from server.sessions.manager import SessionManager
from signaling.errors import ApiError

WAV_TYPES = ("audio/wav", "audio/x-wav", "audio/wave")
PCM16_SCALE = 32768.0


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """PCM 16-bit WAV bytes -> (float32 mono, rate); ``ApiError`` 400 when it is not one."""
    try:
        with wave.open(io.BytesIO(data)) as reader:
            if reader.getsampwidth() != 2:
                raise ApiError(400, "invalid_audio", "The WAV file must be 16-bit PCM.")
            rate, channels = reader.getframerate(), reader.getnchannels()
            frames = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ApiError(400, "invalid_audio", f"The body is not a WAV file: {exc}.") from exc
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / PCM16_SCALE
    return samples.reshape(-1, channels).mean(axis=1), rate


async def _read_body(request: web.Request) -> bytes:
    if request.content_type not in WAV_TYPES:
        got = request.content_type or "none"
        raise ApiError(415, "unsupported_media_type", f"Send audio/wav (got {got}).")
    return await read_body(request, MAX_PROMPT_BYTES)


class PromptRoutes:
    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions

    def handlers(self) -> dict[str, Handler]:
        """This class's handlers by their names in ``server.http.routes``."""
        return {"set_prompt": self.set_prompt}

    async def set_prompt(self, request: web.Request) -> web.Response:
        session = self._sessions.get(request.match_info["session_id"])
        engine = session.engine
        if not engine.capabilities.voice_prompt:
            raise ApiError(
                400, "no_voice_prompt", f"Engine '{engine.name}' does not take a voice prompt."
            )
        audio, rate = decode_wav(await _read_body(request))
        transcript = request.query.get("transcript", "")
        try:
            await session.pipeline.set_voice_prompt(audio, rate, transcript)
        except ValueError as exc:  # PromptError: too short, too long, no transcript
            raise ApiError(400, "invalid_prompt", str(exc)) from exc
        return web.json_response({"seconds": round(len(audio) / rate, 2)})
