"""Speaker prompts: a built-in speaker, or a clip and its transcript for zero-shot cloning.

A clip is analysed once, when it is set (upstream analyses it again for every utterance):
its speech tokens (Whisper log-mel through ``speech_tokenizer_v2.onnx``), its speaker
embedding (Kaldi filter banks through ``campplus.onnx``) and its 24 kHz mel (the flow's
prompt). The tokens and the mel are trimmed to the same length, two mel frames per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr
import torch

from media.engines.cosyvoice.features import (
    PROMPT_RATE,
    WHISPER_RATE,
    kaldi_fbank,
    prompt_mel,
    whisper_log_mel,
)
from media.engines.cosyvoice.flow_window import MEL_FRAMES_PER_TOKEN, FlowPrompt
from media.engines.cosyvoice.modeldir import LoadedModel, Speaker

MAX_PROMPT_SECONDS = 30.0  # the speech tokenizer's limit
MIN_PROMPT_SECONDS = 0.5
EMBEDDING_SIZE = 192
MEL_BINS = 80


class PromptError(ValueError):
    """A prompt clip or transcript that cannot be used; the message says why."""


@dataclass(frozen=True)
class SpeakerPrompt:
    """Everything one voice needs, for the LLM and for the flow."""

    flow: FlowPrompt
    text: np.ndarray  # text token ids of the transcript (empty without a clip)
    tokens: np.ndarray  # speech tokens of the clip, for the LLM (empty without a clip)


def _empty_ids() -> np.ndarray:
    return np.zeros(0, np.int64)


def prompt_from_speaker(speaker: Speaker) -> SpeakerPrompt:
    tokens = speaker.prompt_tokens if speaker.prompt_tokens is not None else _empty_ids()
    feat = speaker.prompt_feat if speaker.prompt_feat is not None else np.zeros((0, MEL_BINS))
    tokens, feat = _aligned(tokens.astype(np.int64), feat.astype(np.float32))
    text = speaker.prompt_text if speaker.prompt_text is not None else _empty_ids()
    return _prompt(speaker.embedding, tokens, feat, text.astype(np.int64))


def neutral_prompt() -> SpeakerPrompt:
    """No speaker information at all: what upstream uses when it is given none."""
    return _prompt(
        np.zeros(EMBEDDING_SIZE, np.float32), _empty_ids(), np.zeros((0, MEL_BINS)), _empty_ids()
    )


def _aligned(tokens: np.ndarray, feat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    count = min(len(tokens), len(feat) // MEL_FRAMES_PER_TOKEN)
    return tokens[:count], feat[: count * MEL_FRAMES_PER_TOKEN]


def _prompt(
    embedding: np.ndarray, tokens: np.ndarray, feat: np.ndarray, text: np.ndarray
) -> SpeakerPrompt:
    flow = FlowPrompt(
        tokens=torch.from_numpy(tokens.astype(np.int32))[None],
        feat=torch.from_numpy(np.ascontiguousarray(feat, dtype=np.float32))[None],
        embedding=torch.from_numpy(embedding.astype(np.float32).reshape(1, -1)),
    )
    return SpeakerPrompt(flow=flow, text=text, tokens=tokens)


def speech_tokens(model: LoadedModel, audio_16k: np.ndarray) -> np.ndarray:
    """Speech tokens (25 per second) of 16 kHz audio, through the ONNX tokenizer."""
    feats = whisper_log_mel(audio_16k)[None]
    session = model.speech_tokenizer
    names = [node.name for node in session.get_inputs()]
    (tokens,) = session.run(
        None, {names[0]: feats, names[1]: np.array([feats.shape[2]], dtype=np.int32)}
    )
    return np.asarray(tokens).reshape(-1).astype(np.int64)


def speaker_embedding(model: LoadedModel, audio_16k: np.ndarray) -> np.ndarray:
    feats = kaldi_fbank(audio_16k)
    feats = feats - feats.mean(axis=0, keepdims=True)
    session = model.campplus
    (embedding,) = session.run(None, {session.get_inputs()[0].name: feats[None]})
    return np.asarray(embedding, np.float32).reshape(-1)


def text_ids(model: LoadedModel, text: str) -> np.ndarray:
    return np.array(model.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)


def prompt_from_clip(
    model: LoadedModel, audio: np.ndarray, rate: int, transcript: str | None
) -> SpeakerPrompt:
    """Analyse a prompt clip (float32 mono at ``rate``) and its transcript, once.

    The LLM needs the transcript (speech follows the prompt's text and speech tokens); voice
    conversion uses only the flow's part and passes None.
    """
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    seconds = len(audio) / rate
    if not MIN_PROMPT_SECONDS <= seconds <= MAX_PROMPT_SECONDS:
        raise PromptError(
            f"a prompt clip must last {MIN_PROMPT_SECONDS}-{MAX_PROMPT_SECONDS:.0f} s, "
            f"not {seconds:.1f} s"
        )
    if transcript is not None and not transcript.strip():
        raise PromptError("the prompt clip needs its transcript")
    # The tokenizer's Whisper features and CAM++'s filter banks are both taken at 16 kHz.
    audio_16k = audio if rate == WHISPER_RATE else soxr.resample(audio, rate, WHISPER_RATE)
    audio_24k = audio if rate == PROMPT_RATE else soxr.resample(audio, rate, PROMPT_RATE)
    tokens, feat = _aligned(speech_tokens(model, audio_16k), prompt_mel(audio_24k))
    text = text_ids(model, transcript) if transcript is not None else _empty_ids()
    return _prompt(speaker_embedding(model, audio_16k), tokens, feat, text)
