"""Choosing the next speech token: upstream's repetition-aware sampling, per session.

CosyVoice2 samples from the nucleus (top-p 0.8, at most 25 candidates) and, when the pick
already appears in the last 10 tokens (repeats loop the voice), draws again from the whole
distribution. Upstream draws from torch's global generator, so concurrent sessions perturb each
other's draws and no session can be replayed; here each session owns a ``torch.Generator``.

Upstream forbids the end token before the minimum length by redrawing up to 100 times and then
raising; masking its logit is equivalent and cannot fail.
"""

from __future__ import annotations

from typing import Any

import torch

TOP_P = 0.8
TOP_K = 25
REPEAT_WINDOW = 10
REPEAT_RATIO = 0.1  # redraw once this share of the window repeats the pick


def sample_token(
    log_probs: torch.Tensor,
    recent: list[int],
    generator: torch.Generator,
    banned: tuple[int, ...] = (),
) -> int:
    """One token id from ``log_probs`` (1-D), never one of ``banned``."""
    scores = log_probs.float().cpu()  # the generator, and so the draw, is on the CPU
    if banned:
        scores = scores.clone()
        scores[list(banned)] = -float("inf")
    probs = scores.softmax(dim=0)
    choice = _nucleus(probs, generator)
    window = recent[-REPEAT_WINDOW:]
    if window.count(choice) >= REPEAT_WINDOW * REPEAT_RATIO:
        choice = int(torch.multinomial(probs, 1, generator=generator).item())
    return choice


def _nucleus(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Top-p within top-k: candidates whose preceding mass is still below ``TOP_P``."""
    top, ids = probs.topk(min(TOP_K, probs.numel()))
    before = top.cumsum(0) - top
    keep = top[before < TOP_P]
    pick = torch.multinomial(keep / keep.sum(), 1, generator=generator)
    return int(ids[pick].item())


def new_generator(seed: int | None) -> Any:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
