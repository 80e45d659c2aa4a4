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

Each row's position (its length) is kept on the device beside the keys and values and
advanced there, so a step copies nothing from the host. ``decode_step`` attends over the
longest row's length, the cheapest on a CPU. With ``static`` it runs every row of the
cache's capacity (rows not in use compute and are ignored) over its whole length: the same
shapes from one step to the next until the cache grows, and nothing read from the host,
which is what a CUDA graph can capture (``DecodeGraph``: one capture per cache shape, then
replays; on a GPU a step of a small model is dominated by launching its kernels one by one
from Python). Both give the same hidden states, up to float rounding.

The decode step re-states Qwen2's decoder layer (pre-norm attention with rotary positions and
grouped key/value heads, pre-norm SiLU-gated MLP) with the module's own weights; the prefill
is the library's. ``tests/cosyvoice/test_batching.py`` checks the step against the library's
forward on the same cache, in both forms and through ``DecodeGraph`` without capture.
"""

from __future__ import annotations

from collections.abc import Callable
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
        self.lengths: list[int] = []  # per packed row, on the host
        # The same on the device, for every row of the capacity (0 where none is in use), and
        # 1 for the rows in use: a step advances ``positions`` by ``active`` in place.
        self.positions = like.new_zeros(FIRST_ROWS, dtype=torch.long)
        self.active = like.new_zeros(FIRST_ROWS, dtype=torch.long)
        self.generation = 0  # counts the times the tensors were replaced by larger ones

    def _empty(self, rows: int, capacity: int) -> torch.Tensor:
        return self._like.new_zeros(rows, self._shape[0], capacity, self._shape[1])

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity_rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        """Positions per row."""
        return self.keys[0].shape[2]

    def _reserve(self, rows: int, capacity: int) -> None:
        have_rows, have_capacity = self.capacity_rows, self.capacity
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
        for name in ("positions", "active"):
            grown = self._like.new_zeros(new_rows, dtype=torch.long)
            grown[:have_rows] = getattr(self, name)
            setattr(self, name, grown)
        self.generation += 1

    def add(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
        """Append a row from per-layer (1, kv heads, length, head dim) tensors; its index."""
        row, length = self.rows, keys[0].shape[2]
        self._reserve(row + 1, length + 1)
        for layer, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer][row, :, :length] = key[0]
            self.values[layer][row, :, :length] = value[0]
        self.lengths.append(length)
        self.positions[row] = length
        self.active[row] = 1
        return row

    def remove(self, row: int) -> int | None:
        """Drop ``row``; the last row moves into its place: returns the row that moved."""
        last = self.rows - 1
        if row != last:
            for store in (*self.keys, *self.values):
                store[row, :, : self.lengths[last]] = store[last, :, : self.lengths[last]]
            self.lengths[row] = self.lengths[last]
            self.positions[row] = self.lengths[last]
        self.lengths.pop()
        self.positions[last] = 0
        self.active[last] = 0
        return last if row != last else None

    def make_room(self) -> None:
        """Capacity for one more position in every row."""
        self._reserve(self.rows, max(self.lengths, default=0) + 1)

    def advanced(self) -> None:
        """A step has advanced ``positions``: the host's lengths follow."""
        for row in range(self.rows):
            self.lengths[row] += 1


def prefill(body: Any, inputs: torch.Tensor) -> tuple[torch.Tensor, list[Any], list[Any]]:
    """Run (1, T, hidden) through the Qwen2 body; its last hidden state and per-layer K/V."""
    result = body(inputs_embeds=inputs, use_cache=True)
    cache = result.past_key_values
    keys = [cache.key_cache[layer] for layer in range(len(body.layers))]
    values = [cache.value_cache[layer] for layer in range(len(body.layers))]
    return result.last_hidden_state[:, -1], keys, values


def decode_step(body: Any, cache: SlotCache, inputs: torch.Tensor) -> torch.Tensor:
    """One position for every packed row: (rows, hidden) in, final hidden states out."""
    cache.make_room()
    hidden = _step(body, cache, inputs, max(cache.lengths) + 1)
    cache.advanced()
    return hidden


def static_step(body: Any, cache: SlotCache, inputs: torch.Tensor) -> torch.Tensor:
    """One position for every row of the cache's capacity: (capacity rows, hidden) in and
    out, the rows not in use ignored. Touches only device tensors (the caller has made room
    and calls ``cache.advanced`` after it)."""
    return _step(body, cache, inputs, cache.capacity)


def _step(body: Any, cache: SlotCache, inputs: torch.Tensor, width: int) -> torch.Tensor:
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    rows = inputs.shape[0]
    positions = cache.positions[:rows]
    visible = torch.arange(width, device=inputs.device)[None] <= positions[:, None]
    mask = visible[:, None, None, :]  # (rows, 1, 1, width)
    row_index = torch.arange(rows, device=inputs.device)
    hidden = inputs[:, None]  # (rows, 1, hidden)
    cos, sin = body.rotary_emb(hidden, positions[:, None])
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
        keys[row_index, :, positions] = key[:, :, 0].to(keys.dtype)  # autocast: bf16 or fp16
        values[row_index, :, positions] = value[:, :, 0].to(values.dtype)
        groups = attention.num_key_value_groups
        past_keys = keys[:rows, :, :width].repeat_interleave(groups, dim=1)
        past_values = values[:rows, :, :width].repeat_interleave(groups, dim=1)
        attended = F.scaled_dot_product_attention(query, past_keys, past_values, attn_mask=mask)
        attended = attended.transpose(1, 2).reshape(rows, 1, -1)
        hidden = hidden + attention.o_proj(attended)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    cache.positions[:rows] += cache.active[:rows]
    return body.norm(hidden)[:, 0]


class DecodeGraph:
    """``static_step`` with its inputs and outputs in tensors of its own, captured as a CUDA
    graph for each shape of the cache and replayed for every step until the cache grows.

    Called like ``decode_step``. With ``capture`` off (a CPU) it runs the same step on the
    same buffers without a graph, which is how the tests check it on a CPU.
    """

    def __init__(self, body: Any, cache: SlotCache, *, capture: bool) -> None:
        self._body = body
        self._cache = cache
        self._capture = capture
        self._generation = -1  # the cache generation the buffers and graph were made for
        self._inputs: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._replay: Callable[[], None] | None = None
        self.captures = 0

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        cache = self._cache
        rows = cache.rows
        cache.make_room()
        if self._generation != cache.generation or self._inputs is None:
            self._prepare(inputs)
        assert self._inputs is not None
        self._inputs[:rows].copy_(inputs)
        if self._replay is None:
            self._output = static_step(self._body, cache, self._inputs)
        else:
            self._replay()
        cache.advanced()
        assert self._output is not None
        return self._output[:rows]

    def _prepare(self, like: torch.Tensor) -> None:
        cache = self._cache
        self._generation = cache.generation
        self._inputs = like.new_zeros(cache.capacity_rows, like.shape[-1])
        self._replay = None
        if not self._capture:
            return
        # The graph's kernels run for real once first (CUDA wants a warm-up off the capture
        # stream); that step writes keys at the rows' next positions, which the first real
        # step overwrites, and advances the positions, which are put back.
        positions = cache.positions.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static_step(self._body, cache, self._inputs)
        torch.cuda.current_stream().wait_stream(side)
        cache.positions.copy_(positions)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._output = static_step(self._body, cache, self._inputs)
        self._replay = graph.replay
        self.captures += 1
