"""How many speech tokens each chunk covers: a per-utterance schedule, never a shared knob.

The flow decoder attends in fixed chunks of ``chunk`` tokens (25 for CosyVoice2), counted from
the start of its input, which begins with the speaker prompt's tokens. A frame's mel is final
only once its whole attention chunk exists. Upstream makes the first hop a full chunk plus the
prompt's remainder (up to 49 tokens, ~2 s of speech, before the first audio) and stores the hop
size on the model object it shares with every session. Here the schedule belongs to the
utterance, and first audio waits for ``first_min`` tokens (0.4 s of speech by default), not
for a chunk: every token before the first hop is an LLM step the listener waits through
(on a GPU the largest part of the first chunk).

- The first hop ends at the first grid line at least ``first_min`` tokens in when that line is
  at most ``GRID_SLACK_TOKENS`` further; otherwise it is ``first_min`` tokens exactly and ends
  inside an attention chunk, its frames rendered without the rest of their chunk.
- The hop after such an early end (a *catch-up* hop) runs to the grid line and renders again
  the frames the vocoder still holds back from the early hop (``HELD_TOKENS``, its join
  overlap), now with their whole chunk: the vocoder crossfades from the early rendering to
  the exact one there, so only the audio sent before the held frames is approximate.
- Later hops double from one chunk up to ``max_chunks``, so the fixed cost of each flow call
  (the prompt and the left context) is paid less often once the listener has audio buffered.

A first hop of at most ``HELD_TOKENS`` tokens would send nothing (all of it is held back for
the join), so it stays on the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from media.engines.cosyvoice.flow_window import MEL_FRAMES_PER_TOKEN
from media.engines.cosyvoice.vocoder import MEL_CACHE_FRAMES

CHUNK_TOKENS = 25  # CosyVoice2's attention chunk, used when the model does not say
FIRST_HOP_MIN_TOKENS = 10
MAX_HOP_CHUNKS = 4
GRID_SLACK_TOKENS = 5  # a grid line this close after first_min is worth waiting for
HELD_TOKENS = MEL_CACHE_FRAMES // MEL_FRAMES_PER_TOKEN  # the vocoder's join overlap


@dataclass(eq=False)
class HopSchedule:
    """Hop sizes for one utterance, recorded as they are taken."""

    chunk: int
    prompt_tokens: int
    first_min: int = FIRST_HOP_MIN_TOKENS
    max_chunks: int = MAX_HOP_CHUNKS
    taken: list[int] = field(default_factory=list)

    def next_hop(self) -> int:
        """The size of the next hop, recorded in ``taken``."""
        done = self.prompt_tokens + sum(self.taken)
        off_grid = done % self.chunk
        if not self.taken:
            to_grid = -(-(done + self.first_min) // self.chunk) * self.chunk - done
            early = self.first_min > HELD_TOKENS and to_grid > self.first_min + GRID_SLACK_TOKENS
            hop = self.first_min if early else to_grid
        elif off_grid:  # the first hop ended early: catch up to the grid
            hop = self.chunk - off_grid
        else:
            caught_up = self._off_grid(self.taken[:1])
            doubling = len(self.taken) - 1 - caught_up
            hop = self.chunk * min(2**doubling, self.max_chunks)
        self.taken.append(hop)
        return hop

    @property
    def redo_tokens(self) -> int:
        """Tokens before the hop last taken whose frames it must render again (see above)."""
        return HELD_TOKENS if len(self.taken) > 1 and self._off_grid(self.taken[:-1]) else 0

    def _off_grid(self, hops: list[int]) -> bool:
        """Whether ``hops``, taken from the utterance's start, end inside an attention chunk."""
        return (self.prompt_tokens + sum(hops)) % self.chunk != 0
