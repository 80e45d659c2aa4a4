"""Speech tokens from the LLM, generated in a worker thread and handed over without polling.

Upstream's streaming loop starts an LLM thread and has the consumer sleep 100 ms at a time
until enough tokens have arrived. When the LLM thread raises, the consumer waits forever for
tokens that will never come, and when the listener leaves, nothing stops the thread.

Here the worker appends to a list under a condition variable and notifies on every token, on
the end of speech, and on an error; the consumer blocks in ``wait_for`` until it has the tokens
it asked for or the stream has ended, and an error raised in the worker is raised again in the
consumer. The worker checks its stop flag (and the session's cancel event) before each model
step, so a cancelled utterance stops within one token. The LLM's key/value cache lives in the
worker's frame only and is released when it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from media.engines.cosyvoice.sampling import sample_token

# Upstream's length bounds: speech tokens per text token (25 tokens per second of speech).
MIN_TOKENS_PER_TEXT_TOKEN = 2
MAX_TOKENS_PER_TEXT_TOKEN = 20
STOP_JOIN_SECONDS = 5.0  # one token step is milliseconds on a GPU, ~50 ms for 0.5B on a CPU


class LlmFailed(RuntimeError):
    """The LLM worker raised; the original exception is the cause."""


@dataclass(frozen=True)
class LlmRequest:
    """What one utterance asks of the LLM."""

    text: np.ndarray  # text token ids of what to say
    prompt_text: np.ndarray  # text token ids of the prompt's transcript (may be empty)
    prompt_tokens: np.ndarray  # speech tokens of the prompt clip (may be empty)


def generate_tokens(
    llm: Any, request: LlmRequest, generator: torch.Generator, should_stop: Callable[[], bool]
) -> Iterator[int]:
    """Run Qwen2LM step by step with a key/value cache; yield speech tokens until the end.

    Upstream's input layout: [sos] text(prompt + new) [speech start] prompt speech tokens;
    after that, each step feeds the embedding of the token it sampled last. The Qwen2 body is
    called directly: its output is the final hidden state, and the 150k-word language-model
    head that upstream computes and drops each step would cost ~30 % of a 0.5B step.
    """
    speech_size = llm.speech_token_size
    eos = speech_size
    body = llm.llm.model.model  # Qwen2Model inside Qwen2ForCausalLM
    with torch.inference_mode():
        step_input = prompt_inputs(llm, request)
        min_len, max_len = length_bounds(request)
        cache = None
        out: list[int] = []
        for step in range(max_len):
            if should_stop():
                return
            result = body(inputs_embeds=step_input, past_key_values=cache, use_cache=True)
            cache = result.past_key_values
            logits = llm.llm_decoder(result.last_hidden_state[:, -1]).float()
            log_probs = logits.log_softmax(dim=-1)[0]
            token = sample_token(log_probs, out, generator, banned_tokens(eos, step, min_len))
            if token == eos:
                return
            out.append(token)
            yield token
            step_input = llm.speech_embedding.weight[token].reshape(1, 1, -1)


def prompt_inputs(llm: Any, request: LlmRequest) -> torch.Tensor:
    """(1, T, hidden): [sos] text (prompt + new) [speech start] prompt speech tokens."""
    body = llm.llm.model.model
    device = body.embed_tokens.weight.device
    text = torch.from_numpy(np.concatenate([request.prompt_text, request.text]).astype(np.int64))
    embedded_text = body.embed_tokens(text[None].to(device))
    sos = llm.llm_embedding.weight[llm.sos_eos].reshape(1, 1, -1)
    speech_start = llm.llm_embedding.weight[llm.task_id].reshape(1, 1, -1)
    prompt = torch.from_numpy(request.prompt_tokens.astype(np.int64))[None].to(device)
    return torch.cat([sos, embedded_text, speech_start, llm.speech_embedding(prompt)], dim=1)


def length_bounds(request: LlmRequest) -> tuple[int, int]:
    """Upstream's fewest and most speech tokens for the new text."""
    new_text = len(request.text)
    return new_text * MIN_TOKENS_PER_TEXT_TOKEN, new_text * MAX_TOKENS_PER_TEXT_TOKEN


def banned_tokens(eos: int, step: int, min_len: int) -> tuple[int, ...]:
    """Ids the sampler may not pick at ``step``: the two after the end token (upstream's
    task markers), and the end token itself before the minimum length."""
    after_eos = (eos + 1, eos + 2)
    return (*after_eos, eos) if step < min_len else after_eos


def _finished_producer(should_stop: Callable[[], bool]) -> Iterator[int]:
    return iter(())


class TokenStream:
    """One utterance's speech tokens: a producer thread and a blocking, non-polling reader."""

    def __init__(
        self, produce: Callable[[Callable[[], bool]], Iterator[int]], cancel: threading.Event
    ) -> None:
        self._produce = produce
        self._cancel = cancel
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._tokens: list[int] = []
        self._finished = False
        self._error: BaseException | None = None
        self.steps_after_stop = 0  # tokens produced after stop/cancel was seen set (tests)
        self._thread = threading.Thread(target=self._run, name="cosyvoice-llm", daemon=True)

    def start(self) -> TokenStream:
        self._thread.start()
        return self

    def should_stop(self) -> bool:
        return self._stop.is_set() or self._cancel.is_set()

    def _run(self) -> None:
        try:
            for token in self._produce(self.should_stop):
                with self._changed:
                    if self.should_stop():
                        self.steps_after_stop += 1
                    self._tokens.append(token)
                    self._changed.notify_all()
        except BaseException as exc:  # handed to the consumer, which raises it
            with self._changed:
                self._error = exc
        finally:
            self._produce = _finished_producer  # nothing of the model call stays referenced
            with self._changed:
                self._finished = True
                self._changed.notify_all()

    def wait_for(self, count: int) -> bool:
        """Block until ``count`` tokens exist (True) or the stream ended short of it (False).

        Wakes on every token, on the end and on an error; a cancel reaches it through the
        worker, which ends within one token step.
        """
        with self._changed:
            self._changed.wait_for(
                lambda: len(self._tokens) >= count or self._finished or self._error is not None
            )
            if self._error is not None:
                raise LlmFailed(f"speech token generation failed: {self._error}") from self._error
            return len(self._tokens) >= count

    def tokens(self, end: int | None = None) -> np.ndarray:
        with self._changed:
            return np.array(self._tokens[:end], dtype=np.int32)

    def __len__(self) -> int:
        with self._changed:
            return len(self._tokens)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the worker and wait for it (one token step at most)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(STOP_JOIN_SECONDS)
