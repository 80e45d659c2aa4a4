"""All utterances of one model in one worker: a batched LLM step per token, batched hops.

The sequential path gives each utterance its own LLM thread and renders its hops in the
session's thread, so N utterances pay N times every fixed cost of every model call and the
threads compete for the same cores. Here one thread per loaded model runs a loop:

1. admit new utterances (bounded: at most ``slots`` at once, the rest wait in arrival order):
   each prompt is prefilled alone and its cache moves into a row of the shared batch
   (``batch_llm``);
2. drop utterances that were cancelled, or whose listener left, since the last pass;
3. render the hops that are ready (their tokens and the encoder's lookahead exist, or the LLM
   has ended): first hops before later ones, at most ``max_hops`` per pass, flow in one call
   (``flow_batch``) and HiFT in one call per shape (``vocoder.vocode_batch``). A first hop
   that is ready waits up to ``GATHER_STEPS`` steps for other first hops that are as close
   to ready, so callers who spoke moments apart share one render: a step costs a few
   milliseconds, a render of first hops of the tiny model on CPU ~45 ms plus ~12 ms a hop,
   and a first hop that missed the render waited that whole render for nothing (4 callers
   started together, admitted over two passes, with oneDNN's convolutions: first audio 245,
   246, 246 and 331 ms);
4. one LLM step for every utterance still generating, each sampled with its session's own
   generator. ``llm_step`` picks how: ``dynamic`` over the rows in use and the longest
   one's length (a CPU's fastest), ``static`` over the cache's whole capacity (constant
   shapes), ``graph`` the static step captured as a CUDA graph (a GPU's).

A pass is one token step plus at most one render, so a cancel is seen within one step, a new
utterance waits at most one render before its prefill, and no utterance's hops wait behind
another's whole sentence. Each utterance keeps its own hop schedule, token list and vocoder
caches; its audio goes to the consumer (the session's synthesis thread) through a queue that
holds at most what the utterance has rendered and not yet been read. An error in a model call
ends the utterances of that call with the error and the loop carries on with the others.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from media.engines.cosyvoice.batch_llm import DecodeGraph, SlotCache, decode_step, prefill
from media.engines.cosyvoice.flow_batch import FlowHop, flow_mel_batch
from media.engines.cosyvoice.modeldir import LoadedModel
from media.engines.cosyvoice.prompts import SpeakerPrompt
from media.engines.cosyvoice.sampling import sample_tokens
from media.engines.cosyvoice.schedule import HopSchedule
from media.engines.cosyvoice.synthesis import MEL_BINS
from media.engines.cosyvoice.tokens import (
    LlmFailed,
    LlmRequest,
    banned_tokens,
    length_bounds,
    prompt_inputs,
)
from media.engines.cosyvoice.vocoder import VocoderCache, vocode_batch

log = logging.getLogger(__name__)

DEFAULT_SLOTS = 32
DEFAULT_MAX_HOPS = 8
GATHER_STEPS = 3
STOP_JOIN_SECONDS = 5.0
END_OF_AUDIO = object()  # put on an utterance's output after its last chunk


class DeliveredAudio:
    """An utterance's side towards its listener: the chunks on ``output`` until
    ``END_OF_AUDIO`` or an exception, read until ``cancel`` or ``left`` is set (the
    utterances of this loop and of a loop process alike)."""

    cancel: threading.Event
    left: threading.Event  # the listener is gone
    output: queue.SimpleQueue[Any]

    @property
    def stopped(self) -> bool:
        return self.cancel.is_set() or self.left.is_set()

    def audio(self) -> Iterator[np.ndarray]:
        """The utterance's chunks as they are rendered; ends early once cancelled."""
        try:
            while not self.stopped:
                item = self.output.get()
                if item is END_OF_AUDIO or self.stopped:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.left.set()


@dataclass(eq=False)
class Utterance(DeliveredAudio):
    """One utterance in the batch: what it says, its voice, and everything it holds."""

    request: LlmRequest
    prompt: SpeakerPrompt
    generator: torch.Generator
    schedule: HopSchedule
    cancel: threading.Event
    output: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    left: threading.Event = field(default_factory=threading.Event)  # the listener is gone
    tokens: list[int] = field(default_factory=list)
    vocoder: VocoderCache = field(default_factory=VocoderCache)
    vocoded: int = 0  # tokens already rendered
    hop_end: int | None = None  # end of the hop being waited for
    decoding: bool = True
    row: int | None = None
    steps: int = 0  # model calls made for it (the prefill is the first)
    held: int = 0  # passes its ready first hop waited for others to join its render
    tokens_after_stop: int = 0  # tokens sampled after a cancel was set (for tests)


class CosyVoiceBatcher:
    """The loop that runs every utterance of one model; see the module docstring."""

    def __init__(
        self,
        model: LoadedModel,
        context_tokens: int | None,
        chunk: int,
        slots: int = DEFAULT_SLOTS,
        max_hops: int = DEFAULT_MAX_HOPS,
        llm_step: str = "dynamic",
    ) -> None:
        self.model = model
        self.context_tokens = context_tokens
        self.chunk = chunk
        self.slots = slots
        self.max_hops = max_hops
        llm = model.llm
        self._llm = llm
        self._body = llm.llm.model.model
        config = self._body.config
        head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        self._cache = SlotCache(
            config.num_hidden_layers,
            config.num_key_value_heads,
            head_dim,
            self._body.embed_tokens.weight,
        )
        self._decode = self._decoder(llm_step)
        self._rows: list[Utterance] = []  # decoding utterances, in packed cache order
        self._active: list[Utterance] = []
        self._waiting: list[Utterance] = []
        self._changed = threading.Condition()
        self._closed = False
        self.steps = 0  # batched LLM steps taken (for stats and tests)
        self.renders = 0
        self._thread = threading.Thread(target=self._run, name="cosyvoice-batch", daemon=True)
        self._thread.start()

    def _decoder(self, llm_step: str) -> Callable[[torch.Tensor], torch.Tensor]:
        if llm_step == "dynamic":
            return lambda inputs: decode_step(self._body, self._cache, inputs)
        if llm_step not in ("static", "graph"):
            raise ValueError(f"llm_step is dynamic, static or graph, not {llm_step!r}")
        capture = llm_step == "graph"
        if capture and self._body.norm.weight.device.type != "cuda":
            raise ValueError("llm_step graph needs the model on a CUDA device")
        return DecodeGraph(self._body, self._cache, capture=capture)

    def speak(
        self,
        request: LlmRequest,
        prompt: SpeakerPrompt,
        generator: torch.Generator,
        schedule: HopSchedule,
        cancel: threading.Event,
    ) -> Utterance:
        utterance = Utterance(request, prompt, generator, schedule, cancel)
        with self._changed:
            if self._closed:
                raise LlmFailed("the CosyVoice batch worker has stopped")
            self._waiting.append(utterance)
            self._changed.notify_all()
        return utterance

    @property
    def active(self) -> int:
        with self._changed:
            return len(self._active) + len(self._waiting)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(STOP_JOIN_SECONDS)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._waiting or self._active)
                if self._closed:
                    break
                room = max(0, self.slots - len(self._active))
                admitted, self._waiting = self._waiting[:room], self._waiting[room:]
            try:
                with torch.inference_mode():
                    self._pass(admitted)
            except Exception as exc:  # a bug here must not leave consumers waiting forever
                log.exception("CosyVoice batch worker pass failed")
                # Admitted utterances may already be active: each is ended once.
                self._fail(list(dict.fromkeys([*self._active, *admitted])), exc, exc)
        with self._changed:
            for utterance in (*self._active, *self._waiting):
                utterance.output.put(END_OF_AUDIO)
            self._active, self._waiting = [], []

    def _pass(self, admitted: list[Utterance]) -> None:
        for utterance in admitted:
            self._admit(utterance)
        for utterance in [u for u in self._active if u.stopped]:
            self._finish(utterance)
        ready = [u for u in self._active if self._hop_ready(u)]
        first = [u for u in ready if u.vocoded == 0]
        if first and self._gathering(first):
            for utterance in first:
                utterance.held += 1
        elif ready:
            self._render((first or ready)[: self.max_hops])
        if self._rows:
            self._step()

    def _gathering(self, first: list[Utterance]) -> bool:
        """Whether the ready first hops ``first`` should wait one more step: another
        utterance's first hop is at most the steps they may still wait from ready."""
        left = GATHER_STEPS - max(utterance.held for utterance in first)
        if left <= 0 or len(first) >= self.max_hops:
            return False
        lookahead = self.model.flow.pre_lookahead_len
        for utterance in self._rows:  # still decoding, so one step brings it closer
            if utterance.vocoded or utterance in first or utterance.hop_end is None:
                continue
            if utterance.hop_end + lookahead - len(utterance.tokens) <= left:
                return True
        return False

    def _admit(self, utterance: Utterance) -> None:
        with self._changed:
            self._active.append(utterance)
        if utterance.stopped:
            return
        try:
            hidden, keys, values = prefill(self._body, prompt_inputs(self._llm, utterance.request))
            self._sample([utterance], self._log_probs(hidden))
        except Exception as exc:  # this utterance's prompt only; the others carry on
            self._fail([utterance], LlmFailed(f"speech token generation failed: {exc}"), exc)
            return
        if utterance.decoding:
            utterance.row = self._cache.add(keys, values)
            self._rows.append(utterance)

    def _step(self) -> None:
        rows = list(self._rows)
        last = torch.tensor([u.tokens[-1] for u in rows], device=self._body.norm.weight.device)
        try:
            hidden = self._decode(self._llm.speech_embedding.weight[last])
            self.steps += 1
            self._sample(rows, self._log_probs(hidden))
        except Exception as exc:
            self._fail(rows, LlmFailed(f"speech token generation failed: {exc}"), exc)
            return
        for utterance in rows:
            if not utterance.decoding:
                self._leave_rows(utterance)

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, speech tokens + 3) log-probabilities from final hidden states (rows, hidden)."""
        return self._llm.llm_decoder(hidden).float().log_softmax(dim=-1)

    def _sample(self, utterances: list[Utterance], log_probs: torch.Tensor) -> None:
        """Append each utterance's next token (or end its decoding) from its row of log-probs."""
        eos = self._llm.speech_token_size
        bounds = [length_bounds(utterance.request) for utterance in utterances]
        tokens = sample_tokens(
            log_probs,
            [utterance.tokens for utterance in utterances],
            [utterance.generator for utterance in utterances],
            [
                banned_tokens(eos, u.steps, low)
                for u, (low, _) in zip(utterances, bounds, strict=True)
            ],
        )
        for utterance, token, (_, max_len) in zip(utterances, tokens, bounds, strict=True):
            if utterance.stopped:
                utterance.tokens_after_stop += 1
            utterance.steps += 1
            if token == eos:
                utterance.decoding = False
                continue
            utterance.tokens.append(token)
            if utterance.steps >= max_len:
                utterance.decoding = False

    def _hop_ready(self, utterance: Utterance) -> bool:
        if utterance.hop_end is None:
            utterance.hop_end = utterance.vocoded + utterance.schedule.next_hop()
        lookahead = self.model.flow.pre_lookahead_len
        return len(utterance.tokens) >= utterance.hop_end + lookahead or not utterance.decoding

    def _render(self, utterances: list[Utterance]) -> None:
        lookahead = self.model.flow.pre_lookahead_len
        hops, finals = [], []
        for utterance in utterances:
            end = utterance.hop_end
            assert end is not None
            final = len(utterance.tokens) < end + lookahead
            if final:
                end = len(utterance.tokens)
            tokens = np.array(utterance.tokens, dtype=np.int32)
            redo = utterance.schedule.redo_tokens if end > utterance.vocoded else 0
            hops.append(
                FlowHop(utterance.prompt.flow, tokens, utterance.vocoded - redo, end, final)
            )
            finals.append(final)
            if redo:
                utterance.vocoder.replace_held_mel()
        try:
            with_tokens = [index for index, hop in enumerate(hops) if hop.end > hop.start]
            mels = [torch.zeros(1, MEL_BINS, 0, device=self.model.device) for _ in hops]
            with self.model.reduced():
                rendered = flow_mel_batch(
                    self.model.flow, [hops[i] for i in with_tokens], self.context_tokens, self.chunk
                )
            for index, mel in zip(with_tokens, rendered, strict=True):
                mels[index] = mel
            caches = [utterance.vocoder for utterance in utterances]
            audio = vocode_batch(self.model.hift, caches, mels, finals)
        except Exception as exc:
            self._fail(utterances, exc, exc)
            return
        self.renders += 1
        for utterance, hop, chunk in zip(utterances, hops, audio, strict=True):
            utterance.vocoded, utterance.hop_end = hop.end, None
            if len(chunk):
                utterance.output.put(chunk)
            if hop.final:
                self._finish(utterance)

    def _leave_rows(self, utterance: Utterance) -> None:
        if utterance.row is None:
            return
        moved = self._cache.remove(utterance.row)
        if moved is not None:
            self._rows[utterance.row] = self._rows[moved]
            self._rows[utterance.row].row = utterance.row
        self._rows.pop()
        utterance.row = None

    def _finish(self, utterance: Utterance, ending: Any = END_OF_AUDIO) -> None:
        self._leave_rows(utterance)
        utterance.decoding = False
        with self._changed:
            if utterance in self._active:
                self._active.remove(utterance)
        utterance.output.put(ending)

    def _fail(self, utterances: list[Utterance], error: BaseException, cause: Exception) -> None:
        log.warning("CosyVoice batch call failed for %d utterances: %s", len(utterances), cause)
        if error is not cause:
            error.__cause__ = cause
        for utterance in utterances:
            self._finish(utterance, error)
