"""The flow for several utterances' hops in one call, each as if it ran alone.

Upstream's ``CausalMaskedDiffWithXvec.inference`` takes one utterance (it asserts batch 1) and
its solver builds a batch of exactly two (the guided and the unguided half). On a small model
most of a flow call is the fixed cost of each layer call, so hops that are ready at the same
time are worth running together. This module does upstream's inference for a batch of hops
of different lengths, right-padded, and keeps every valid frame what it would be alone:

- the encoder and the decoder are causal in time (causal convolutions, chunk attention
  masks counted from position 0) and mask padded keys, so padding after a hop changes none of
  its frames;
- the encoder's lookahead tokens, which upstream embeds and feeds to the lookahead layer as a
  separate ``context``, are placed right after each hop's tokens (the positional encoding is
  relative, so their embedding is the same) and masked as keys; a final hop (no lookahead)
  has zeros there, as upstream pads it;
- the solver's noise is the flow's fixed sequence indexed by frame, the same for every row.

``tests/cosyvoice/test_batching.py`` checks hops of different lengths against ``flow_mel``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from media.engines.cosyvoice.flow_window import MEL_FRAMES_PER_TOKEN, FlowPrompt, window_start

SOLVER_STEPS = 10  # upstream's n_timesteps for CosyVoice2


@dataclass(frozen=True)
class FlowHop:
    """One utterance's hop: ``tokens`` must reach ``end`` (+ the lookahead unless final)."""

    prompt: FlowPrompt
    tokens: np.ndarray
    start: int
    end: int
    final: bool


def _pad_masks(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, 1, width) booleans: True where a frame is inside its row's length."""
    return (torch.arange(width, device=lengths.device)[None] < lengths[:, None])[:, None]


def flow_mel_batch(
    flow: Any, hops: list[FlowHop], context_tokens: int | None, chunk: int
) -> list[torch.Tensor]:
    """Mel (1, 80, 2 * (end - start)) of each hop, as ``flow_mel`` would give it alone."""
    from cosyvoice.utils.mask import add_optional_chunk_mask

    device = flow.input_embedding.weight.device
    lookahead = flow.pre_lookahead_len
    firsts = [window_start(hop.start, context_tokens, chunk) for hop in hops]
    rows: list[np.ndarray] = []
    real: list[int] = []  # prompt + window tokens that become frames
    for hop, first in zip(hops, firsts, strict=True):
        stop = hop.end if hop.final else hop.end + lookahead
        row = np.concatenate(
            [hop.prompt.tokens[0].cpu().numpy().astype(np.int64), hop.tokens[first:stop]]
        )
        rows.append(row)
        real.append(len(row) - (0 if hop.final else lookahead))
    width = max(len(row) for row in rows)
    batch = len(hops)
    tokens = torch.zeros(batch, width, dtype=torch.int64)
    present = torch.zeros(batch, width, 1)
    for index, row in enumerate(rows):
        tokens[index, : len(row)] = torch.from_numpy(row)
        present[index, : len(row)] = 1.0
    tokens, present = tokens.to(device), present.to(device)
    real_lengths = torch.tensor(real, dtype=torch.int32, device=device)
    with torch.inference_mode():
        embedding = torch.cat([hop.prompt.embedding for hop in hops]).to(device)
        speaker = flow.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        embedded = flow.input_embedding(tokens.clamp(min=0)) * present
        encoded = _encode(flow.encoder, embedded, present, real_lengths, add_optional_chunk_mask)
        mu = flow.encoder_proj(encoded)  # (B, 2 * width, 80)
        frames = 2 * width
        conds = torch.zeros(batch, frames, flow.output_size, device=device, dtype=mu.dtype)
        for index, hop in enumerate(hops):
            feat = hop.prompt.feat.to(device)
            conds[index, : feat.shape[1]] = feat[0]
        mask = _pad_masks(2 * real_lengths, frames).to(mu.dtype)
        mel = _solve(flow.decoder, mu.transpose(1, 2), mask, speaker, conds.transpose(1, 2))
    out = []
    for index, (hop, first) in enumerate(zip(hops, firsts, strict=True)):
        begin = hop.prompt.feat.shape[1] + (hop.start - first) * MEL_FRAMES_PER_TOKEN
        out.append(mel[index : index + 1, :, begin : 2 * real[index]].float())
    return out


def _encode(
    encoder: Any,
    embedded: torch.Tensor,
    present: torch.Tensor,
    lengths: torch.Tensor,
    chunk_mask: Any,
) -> torch.Tensor:
    """Upstream's ``UpsampleConformerEncoder.forward`` with the lookahead inside each row."""
    width = embedded.shape[1]
    masks = _pad_masks(lengths, width)
    xs, pos_emb, masks = encoder.embed(embedded, masks)
    xs = xs * present  # after a final hop, zeros, as the lookahead layer pads them
    chunk_masks = chunk_mask(xs, masks, False, False, 0, encoder.static_chunk_size, -1)
    xs = encoder.pre_lookahead_layer(xs)
    xs = encoder.forward_layers(xs, chunk_masks, pos_emb, masks)
    xs, up_lengths = encoder.up_layer(xs.transpose(1, 2).contiguous(), lengths)
    xs = xs.transpose(1, 2).contiguous()
    masks = _pad_masks(up_lengths, xs.shape[1])
    xs, pos_emb, masks = encoder.up_embed(xs, masks)
    stride = encoder.static_chunk_size * encoder.up_layer.stride
    chunk_masks = chunk_mask(xs, masks, False, False, 0, stride, -1)
    xs = encoder.forward_up_layers(xs, chunk_masks, pos_emb, masks)
    if encoder.normalize_before:
        xs = encoder.after_norm(xs)
    return xs


def _solve(
    decoder: Any, mu: torch.Tensor, mask: torch.Tensor, speaker: torch.Tensor, cond: torch.Tensor
) -> torch.Tensor:
    """Upstream's Euler solver with classifier-free guidance, for B rows at once (2B inside)."""
    batch, frames = mu.shape[0], mu.shape[2]
    x = decoder.rand_noise[:, :, :frames].to(mu.device).to(mu.dtype).expand(batch, -1, -1)
    t_span = torch.linspace(0, 1, SOLVER_STEPS + 1, device=mu.device, dtype=mu.dtype)
    if decoder.t_scheduler == "cosine":
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
    rate = decoder.inference_cfg_rate
    mask_in = torch.cat([mask, mask])
    mu_in = torch.cat([mu, torch.zeros_like(mu)])
    spks_in = torch.cat([speaker, torch.zeros_like(speaker)])
    cond_in = torch.cat([cond, torch.zeros_like(cond)])
    t = t_span[0]
    for step in range(1, len(t_span)):
        dt = t_span[step] - t
        x_in = torch.cat([x, x])
        t_in = t.expand(2 * batch)
        velocity = decoder.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=True)
        guided, unguided = velocity[:batch], velocity[batch:]
        x = x + dt * ((1.0 + rate) * guided - rate * unguided)
        t = t_span[step]
    return x
