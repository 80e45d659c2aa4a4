"""The streaming scheduler: speech tokens in, audio chunks out, one utterance at a time.

    LLM worker (tokens.py) --tokens--> wait for the next hop + lookahead (no polling)
      -> flow over a bounded window (flow_window.py) -> HiFT with the session's caches
         (vocoder.py) -> yield the chunk

Everything an utterance holds (its token stream, hop schedule and vocoder caches) lives in an
``UtteranceStream`` owned by the session's state; the shared model is only read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from media.engines.cosyvoice.flow_window import flow_mel
from media.engines.cosyvoice.modeldir import LoadedModel
from media.engines.cosyvoice.prompts import SpeakerPrompt
from media.engines.cosyvoice.schedule import HopSchedule
from media.engines.cosyvoice.tokens import TokenStream
from media.engines.cosyvoice.vocoder import VocoderCache, vocode

MEL_BINS = 80


@dataclass(eq=False)
class UtteranceStream:
    """One utterance in progress: its LLM worker, hop schedule and vocoder caches."""

    tokens: TokenStream
    schedule: HopSchedule
    vocoder: VocoderCache = field(default_factory=VocoderCache)
    vocoded_tokens: int = 0


def stream_speech(
    model: LoadedModel,
    prompt: SpeakerPrompt,
    stream: UtteranceStream,
    context_tokens: int | None,
    chunk: int,
) -> Iterator[np.ndarray]:
    """Yield audio chunks as the hop schedule's tokens arrive, the last one when the LLM ends.

    ``cancel`` reaches this loop through the token stream, which also stops when the session
    closes mid-utterance (``close_state``); either way no further model call is made.
    """
    lookahead = model.flow.pre_lookahead_len
    while not stream.tokens.should_stop():
        start = stream.vocoded_tokens
        end = start + stream.schedule.next_hop()
        complete = stream.tokens.wait_for(end + lookahead)
        if stream.tokens.should_stop():  # cancelled, or the session closed meanwhile
            return
        if complete:
            tokens = stream.tokens.tokens(end + lookahead)
        else:
            tokens = stream.tokens.tokens()
            end = len(tokens)
        if end > start:
            first = start - stream.schedule.redo_tokens
            with model.reduced():
                mel = flow_mel(
                    model.flow, prompt.flow, tokens, first, end, not complete, context_tokens, chunk
                ).float()
            if first < start:
                stream.vocoder.replace_held_mel()
        else:
            mel = torch.zeros(1, MEL_BINS, 0, device=model.device)
        stream.vocoded_tokens = end
        audio = vocode(model.hift, stream.vocoder, mel, final=not complete)
        if len(audio):
            yield audio
        if not complete:
            return
