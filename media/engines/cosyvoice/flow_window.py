"""Speech tokens to mel for one hop, over a bounded window of left context.

The flow (a conformer encoder and a flow-matching decoder, both masked in chunks of 25 tokens
with all earlier chunks visible, and a fixed noise sequence indexed by position) is causal at
chunk granularity: the mel of a finished chunk does not change when tokens are appended. Upstream
still re-runs it over the prompt and every token so far for each hop and keeps only the new
frames, so an utterance costs O(n^2). The modules of this release expose no key/value caches
(an earlier release did; exact caches for every attention layer of every solver step would
hold ~0.2 GB per second of speech for the 0.5B model: 10 steps x 2 (guidance) x 56 blocks x
K and V x 512 channels x 50 frames x 4 bytes), so incremental work here means a bounded
window: the prompt, then at most ``context_tokens`` tokens before the hop (rounded down to a
chunk boundary, which keeps every token on the grid it had), then the hop and the 3-token
lookahead. Each hop then costs the same however long the utterance is. ``context_tokens``
None reproduces upstream's full recompute exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

DEFAULT_CONTEXT_TOKENS = 100  # 4 s of speech, four attention chunks
MEL_FRAMES_PER_TOKEN = 2


@dataclass(frozen=True)
class FlowPrompt:
    """The speaker conditioning the flow gets: prompt tokens, their mel, and an embedding."""

    tokens: torch.Tensor  # (1, P) int32
    feat: torch.Tensor  # (1, 2P, 80)
    embedding: torch.Tensor  # (1, 192)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])


def window_start(start: int, context_tokens: int | None, chunk: int) -> int:
    """First token of the window for a hop starting at ``start``: on the chunk grid."""
    if context_tokens is None:
        return 0
    return max(0, (start - context_tokens) // chunk * chunk)


def flow_mel(
    flow: Any,
    prompt: FlowPrompt,
    tokens: np.ndarray,
    start: int,
    end: int,
    final: bool,
    context_tokens: int | None,
    chunk: int,
    streaming: bool = True,
) -> torch.Tensor:
    """Mel (1, 80, 2 * (end - start)) of tokens[start:end].

    Not final: ``tokens`` must reach ``end + pre_lookahead_len`` (the encoder's lookahead).
    Final: ``end`` is the last token and there is no lookahead. ``streaming=False`` lifts the
    chunk masks (full attention), for a whole utterance rendered at once.
    """
    first = window_start(start, context_tokens, chunk)
    stop = end if final else end + flow.pre_lookahead_len
    device = flow.input_embedding.weight.device
    window = torch.from_numpy(np.ascontiguousarray(tokens[first:stop], dtype=np.int32))[None]
    mel, _ = flow.inference(
        token=window.to(device),
        token_len=torch.tensor([window.shape[1]], dtype=torch.int32, device=device),
        prompt_token=prompt.tokens.to(device),
        prompt_token_len=torch.tensor([prompt.length], dtype=torch.int32, device=device),
        prompt_feat=prompt.feat.to(device),
        prompt_feat_len=torch.tensor([prompt.feat.shape[1]], dtype=torch.int32, device=device),
        embedding=prompt.embedding.to(device),
        streaming=streaming,
        finalize=final,
    )
    return mel[:, :, (start - first) * MEL_FRAMES_PER_TOKEN :]
