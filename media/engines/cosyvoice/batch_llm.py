"""One LLM step for every active utterance: Qwen2 decoding with a key/value cache per slot.

Each utterance's prompt (text, prompt speech) is run alone through the Qwen2 body, as the
sequential path does; its key/value cache then moves into a row of shared batch tensors
(``SlotCache``: per layer, keys and values of shape (rows, kv heads, capacity, head dim)).
After that, every step feeds the last sampled token of all slots through the layers at
once: the projections and the MLP are batched matrix products, and attention runs over each
row's own length through a key mask, so a row never sees another row's keys and a slot that
joins or leaves between steps changes nothing for the others. Active rows stay packed at the
front (a leaving row is replaced by the last one), so a step reads plain slices, not
gathered copies.

The decode step re-states Qwen2's decoder layer (pre-norm attention with rotary positions and
grouped key/value heads, pre-norm SiLU-gated MLP) with the module's own weights; the prefill
is the library's. ``tests/cosyvoice/test_batching.py`` checks the step against the library's
forward on the same cache.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

FIRST_CAPACITY = 256  # positions per row to begin with; doubled when a row reaches it
FIRST_ROWS = 4


class SlotCache:
    """Packed key/value rows for the active utterances of one batch."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, like: torch.Tensor) -> None:
        self._shape = (kv_heads, head_dim)
        self._like = like
        self.keys = [self._empty(FIRST_ROWS, FIRST_CAPACITY) for _ in range(layers)]
        self.values = [self._empty(FIRST_ROWS, FIRST_CAPACITY) for _ in range(layers)]
        self.lengths: list[int] = []  # per packed row

    def _empty(self, rows: int, capacity: int) -> torch.Tensor:
        return self._like.new_zeros(rows, self._shape[0], capacity, self._shape[1])

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def _reserve(self, rows: int, capacity: int) -> None:
        have_rows, have_capacity = self.keys[0].shape[0], self.keys[0].shape[2]
        if rows <= have_rows and capacity <= have_capacity:
            return
        new_rows, new_capacity = have_rows, have_capacity
        while new_rows < rows:
            new_rows *= 2
        while new_capacity < capacity:
            new_capacity *= 2
        for store in (self.keys, self.values):
            for layer, old in enumerate(store):
                grown = self._empty(new_rows, new_capacity)
                grown[:have_rows, :, :have_capacity] = old
                store[layer] = grown

    def add(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
        """Append a row from per-layer (1, kv heads, length, head dim) tensors; its index."""
        row, length = self.rows, keys[0].shape[2]
        self._reserve(row + 1, length + 1)
        for layer, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer][row, :, :length] = key[0]
            self.values[layer][row, :, :length] = value[0]
        self.lengths.append(length)
        return row

    def remove(self, row: int) -> int | None:
        """Drop ``row``; the last row moves into its place: returns the row that moved."""
        last = self.rows - 1
        if row != last:
            for store in (*self.keys, *self.values):
                store[row, :, : self.lengths[last]] = store[last, :, : self.lengths[last]]
            self.lengths[row] = self.lengths[last]
        self.lengths.pop()
        return last if row != last else None

    def make_room(self) -> None:
        """Capacity for one more position in every row."""
        self._reserve(self.rows, max(self.lengths, default=0) + 1)


def prefill(body: Any, inputs: torch.Tensor) -> tuple[torch.Tensor, list[Any], list[Any]]:
    """Run (1, T, hidden) through the Qwen2 body; its last hidden state and per-layer K/V."""
    result = body(inputs_embeds=inputs, use_cache=True)
    cache = result.past_key_values
    keys = [cache.key_cache[layer] for layer in range(len(body.layers))]
    values = [cache.value_cache[layer] for layer in range(len(body.layers))]
    return result.last_hidden_state[:, -1], keys, values


def decode_step(body: Any, cache: SlotCache, inputs: torch.Tensor) -> torch.Tensor:
    """One position for every packed row: (rows, hidden) in, final hidden states out."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    rows = cache.rows
    cache.make_room()
    lengths = torch.tensor(cache.lengths, device=inputs.device)
    width = int(max(cache.lengths)) + 1
    visible = torch.arange(width, device=inputs.device)[None] <= lengths[:, None]
    mask = visible[:, None, None, :]  # (rows, 1, 1, width)
    row_index = torch.arange(rows, device=inputs.device)
    hidden = inputs[:, None]  # (rows, 1, hidden)
    cos, sin = body.rotary_emb(hidden, lengths[:, None])
    for layer_index, layer in enumerate(body.layers):
        attention = layer.self_attn
        normed = layer.input_layernorm(hidden)
        head_dim = attention.head_dim
        query = attention.q_proj(normed).view(rows, 1, -1, head_dim).transpose(1, 2)
        key = attention.k_proj(normed).view(rows, 1, -1, head_dim).transpose(1, 2)
        value = attention.v_proj(normed).view(rows, 1, -1, head_dim).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        keys = cache.keys[layer_index]
        values = cache.values[layer_index]
        keys[row_index, :, lengths] = key[:, :, 0]
        values[row_index, :, lengths] = value[:, :, 0]
        groups = attention.num_key_value_groups
        past_keys = keys[:rows, :, :width].repeat_interleave(groups, dim=1)
        past_values = values[:rows, :, :width].repeat_interleave(groups, dim=1)
        attended = F.scaled_dot_product_attention(query, past_keys, past_values, attn_mask=mask)
        attended = attended.transpose(1, 2).reshape(rows, 1, -1)
        hidden = hidden + attention.o_proj(attended)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    for row in range(rows):
        cache.lengths[row] += 1
    return body.norm(hidden)[:, 0]
