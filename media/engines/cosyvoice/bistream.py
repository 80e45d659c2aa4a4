"""Speech tokens from text that is still arriving: CosyVoice2's bistream layout.

CosyVoice2 was also trained on text and speech interleaved in one context: five text tokens,
then the fifteen speech tokens they start, then the next five text tokens, and so on; after
the last text comes the marker that starts speech, and the speech runs to its end token. A
speaker prompt goes in first, its transcript's tokens interleaved with its speech tokens the
same way. So speech for
the start of a reply can begin before the language model writing the reply has finished it,
and prosody carries across the pieces, which a sentence-by-sentence call cannot do.

Differences from upstream's ``inference_bistream``, each removing a way to hang or fail:
upstream waits for the model to choose the filler token that ends a group of fifteen (a model
that never does generates forever) and raises on the other special token; here each group is
exactly fifteen tokens, as trained, and special tokens are never sampled. Its final phase has
no length bound; here it stops at ``MAX_TOKENS_PER_TEXT_TOKEN`` times the text. The stop flag
is checked before every model step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from media.engines.cosyvoice.sampling import sample_token
from media.engines.cosyvoice.tokens import MAX_TOKENS_PER_TEXT_TOKEN

TEXT_PER_GROUP = 5
SPEECH_PER_GROUP = 15


def generate_bistream(
    llm: Any,
    pieces: Iterator[np.ndarray],
    prompt_text: np.ndarray,
    prompt_tokens: np.ndarray,
    generator: torch.Generator,
    should_stop: Callable[[], bool],
) -> Iterator[int]:
    """Yield speech tokens while text token ids arrive piece by piece from ``pieces``.

    ``pieces`` may block while it waits for text; it must end (or raise) when the utterance
    is cancelled, since a blocked read cannot see the stop flag.
    """
    speech_size = llm.speech_token_size
    eos, specials = speech_size, (speech_size, speech_size + 1, speech_size + 2)
    body = llm.llm.model.model
    device = body.embed_tokens.weight.device

    def embed_text(ids: np.ndarray) -> torch.Tensor:
        return body.embed_tokens(torch.from_numpy(ids.astype(np.int64))[None].to(device))

    out: list[int] = []
    cache = None

    def step(step_input: torch.Tensor, banned: tuple[int, ...]) -> int:
        nonlocal cache
        result = body(inputs_embeds=step_input, past_key_values=cache, use_cache=True)
        cache = result.past_key_values
        logits = llm.llm_decoder(result.last_hidden_state[:, -1]).float()
        log_probs = logits.log_softmax(dim=-1)[0]
        return sample_token(log_probs, out, generator, banned)

    with torch.inference_mode():
        text = embed_text(prompt_text)
        prompt = llm.speech_embedding(
            torch.from_numpy(prompt_tokens.astype(np.int64))[None].to(device)
        )
        pending = llm.llm_embedding.weight[llm.sos_eos].reshape(1, 1, -1)  # not yet fed
        seen_text = 0
        owed = 0  # speech tokens the current group still needs
        for ids in pieces:
            text = torch.cat([text, embed_text(ids)], dim=1)
            seen_text += len(ids)
            while prompt.shape[1] and text.shape[1] >= TEXT_PER_GROUP:
                placed = prompt[:, :SPEECH_PER_GROUP]
                pending = torch.cat([pending, text[:, :TEXT_PER_GROUP], placed], dim=1)
                text, prompt = text[:, TEXT_PER_GROUP:], prompt[:, SPEECH_PER_GROUP:]
                owed = SPEECH_PER_GROUP - placed.shape[1]  # a short last group is finished
            if prompt.shape[1]:
                continue  # the prompt is not placed yet: wait for more text
            while owed or text.shape[1] >= TEXT_PER_GROUP:
                if not owed:
                    pending = torch.cat([pending, text[:, :TEXT_PER_GROUP]], dim=1)
                    text, owed = text[:, TEXT_PER_GROUP:], SPEECH_PER_GROUP
                if should_stop():
                    return
                token = step(pending, specials)
                owed -= 1
                out.append(token)
                yield token
                pending = llm.speech_embedding.weight[token].reshape(1, 1, -1)
        speech_start = llm.llm_embedding.weight[llm.task_id].reshape(1, 1, -1)
        pending = torch.cat([pending, text, speech_start, prompt], dim=1)
        for _ in range(max(1, seen_text) * MAX_TOKENS_PER_TEXT_TOKEN):
            if should_stop():
                return
            token = step(pending, (speech_size + 1, speech_size + 2))
            if token == eos:
                return
            out.append(token)
            yield token
            pending = llm.speech_embedding.weight[token].reshape(1, 1, -1)
