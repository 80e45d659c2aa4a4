"""The voices a session can speak in: the server's cached speaker, named clips, a prompt.

The official runtime clones the voice of ``reference_wav`` (16 kHz) with its transcript
``reference_text`` for each request, and falls back to the speaker cached in its
``spk2info.pt`` when a request has neither. So a voice here is a :class:`Reference` (or
None for the cached speaker), checked and resampled once: when a session uploads a prompt,
or at load for the operator's named speakers (``speakers=DIR``: ``NAME.wav`` beside
``NAME.txt``, its transcript).
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from media.audio.resample import StreamResampler
from media.audio.wav import read_wav
from media.engines.cosyvoice_triton.contract import REFERENCE_RATE, Reference

CACHED_SPEAKER = "default"  # the runtime's own cached speaker: no reference inputs sent
PROMPT_SPEAKER = "prompt"  # what a session's ``speaker`` becomes after it uploads a clip
MIN_PROMPT_S = 0.5
MAX_PROMPT_S = 30.0


class PromptError(ValueError):
    """A prompt clip the runtime cannot clone: the message says what is wrong."""


def reference_from_clip(audio: np.ndarray, rate: int, transcript: str) -> Reference:
    """A voice from a clip (float32 mono at ``rate``) and what it says."""
    text = transcript.strip()
    if not text:
        raise PromptError("the prompt needs its transcript: the model reads it with the clip")
    seconds = len(audio) / rate if rate > 0 else 0.0
    if not MIN_PROMPT_S <= seconds <= MAX_PROMPT_S:
        raise PromptError(
            f"the prompt clip is {seconds:.2f} s; it must be {MIN_PROMPT_S:g}-{MAX_PROMPT_S:g} s"
        )
    samples = np.asarray(audio, dtype=np.float32)
    resampled = StreamResampler(rate, REFERENCE_RATE).process(samples, last=True)
    return Reference(np.ascontiguousarray(resampled, dtype=np.float32), text)


def speakers_from(directory: Path | None) -> dict[str, Reference]:
    """The named voices in ``directory``: each ``NAME.wav`` with its transcript ``NAME.txt``.

    Raises ``ValueError`` naming the file that is missing or unusable.
    """
    if directory is None:
        return {}
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory")
    voices: dict[str, Reference] = {}
    for clip in sorted(directory.glob("*.wav")):
        name = clip.stem
        if name in (CACHED_SPEAKER, PROMPT_SPEAKER):
            raise ValueError(f"{clip}: '{name}' is a reserved speaker name")
        transcript = clip.with_suffix(".txt")
        if not transcript.is_file():
            raise ValueError(f"{clip} has no transcript {transcript.name}")
        try:
            voices[name] = reference_from_clip(
                read_wav(clip, REFERENCE_RATE), REFERENCE_RATE, transcript.read_text("utf-8")
            )
        except (PromptError, OSError, EOFError, wave.Error) as exc:
            raise ValueError(f"{clip}: {exc}") from exc
    return voices
