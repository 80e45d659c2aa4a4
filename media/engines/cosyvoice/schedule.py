"""How many speech tokens each chunk covers: a per-utterance schedule, never a shared knob.

The flow decoder attends in fixed chunks of ``chunk`` tokens (25 for CosyVoice2), counted from
the start of its input, which begins with the speaker prompt's tokens. A chunk of output is
final only once its whole attention chunk exists, so every hop must end on that grid.
Upstream makes the first hop a full chunk plus the prompt's remainder (up to 49 tokens, ~2 s
of speech, before the first audio) and stores the hop size on the model object it shares
with every session. Here the schedule belongs to the utterance: the first hop ends at the
first grid line at least ``first_min`` tokens in (0.4 s of speech by default), later hops
double from one chunk up to ``max_chunks``, so the fixed cost of each flow call (the prompt
and the left context) is paid less often once the listener has audio buffered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHUNK_TOKENS = 25  # CosyVoice2's attention chunk, used when the model does not say
FIRST_HOP_MIN_TOKENS = 10
MAX_HOP_CHUNKS = 4


@dataclass(eq=False)
class HopSchedule:
    """Hop sizes for one utterance, recorded as they are taken."""

    chunk: int
    prompt_tokens: int
    first_min: int = FIRST_HOP_MIN_TOKENS
    max_chunks: int = MAX_HOP_CHUNKS
    taken: list[int] = field(default_factory=list)

    def next_hop(self) -> int:
        if not self.taken:
            end = -(-(self.prompt_tokens + self.first_min) // self.chunk) * self.chunk
            hop = end - self.prompt_tokens
        else:
            hop = self.chunk * min(2 ** (len(self.taken) - 1), self.max_chunks)
        self.taken.append(hop)
        return hop
