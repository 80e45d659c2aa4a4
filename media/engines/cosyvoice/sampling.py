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
    return sample_tokens(log_probs[None], [recent], [generator], [banned])[0]


def sample_tokens(
    log_probs: torch.Tensor,
    recent: list[list[int]],
    generators: list[torch.Generator],
    banned: list[tuple[int, ...]],
) -> list[int]:
    """One token per row of ``log_probs`` (rows, vocabulary), each drawn with its own generator.

    The softmax and the nucleus are computed for all rows at once; only the draws, which must
    come from each session's generator in its own order, are made row by row.
    """
    scores = log_probs.float().cpu()  # the generators, and so the draws, are on the CPU
    if any(banned):
        scores = scores.clone()
        for row, forbidden in enumerate(banned):
            scores[row, list(forbidden)] = -float("inf")
    probs = scores.softmax(dim=1)
    top, candidates = probs.topk(min(TOP_K, probs.shape[1]), dim=1)
    before = top.cumsum(1) - top
    choices = []
    for row, generator in enumerate(generators):
        keep = top[row][before[row] < TOP_P]
        pick = torch.multinomial(keep / keep.sum(), 1, generator=generator)
        choice = int(candidates[row, pick].item())
        window = recent[row][-REPEAT_WINDOW:]
        if window.count(choice) >= REPEAT_WINDOW * REPEAT_RATIO:
            choice = int(torch.multinomial(probs[row], 1, generator=generator).item())
        choices.append(choice)
    return choices


def new_generator(seed: int | None) -> Any:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
