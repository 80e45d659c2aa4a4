"""The cosyvoice speak engine on the tiny model: streaming, isolation, cancel, errors, leaks."""

from __future__ import annotations

import gc
import queue
import threading
import time
import weakref

import numpy as np
import pytest
import torch

from media.engines.cosyvoice.flow_window import flow_mel
from media.engines.cosyvoice.prompts import PromptError, text_ids
from media.engines.cosyvoice.schedule import HELD_TOKENS, HopSchedule
from media.engines.cosyvoice.speak import SAMPLES_PER_TOKEN, CosyVoiceEngine
from media.engines.cosyvoice.tokens import LlmFailed
from media.engines.cosyvoice.vocoder import (
    MEL_CACHE_FRAMES,
    SAMPLES_PER_FRAME,
    VocoderCache,
    vocode,
)
from peer.speech import espeak
from tests.cosyvoice.conftest import SENTENCE

ERROR_DEADLINE_S = 1.0


def state_for(engine: CosyVoiceEngine, **options):
    return engine.new_state(engine.validate_options({"seed": 7, **options}))


def expected_samples(engine: CosyVoiceEngine, text: str) -> int:
    """The tiny LLM stops exactly at upstream's minimum: two speech tokens per text token."""
    return 2 * len(text_ids(engine.model, text)) * SAMPLES_PER_TOKEN


def test_chunks_stream_before_the_utterance_is_done(either_engine: CosyVoiceEngine):
    state = state_for(either_engine, speaker="tiny-a")
    chunks, times = [], []
    for chunk in either_engine.synthesize(state, SENTENCE, threading.Event()):
        chunks.append(chunk)
        times.append(time.monotonic())
    assert len(chunks) >= 3
    assert state.first_chunk_at is not None and state.finished_at is not None
    assert state.first_chunk_at < state.finished_at - 0.05
    assert sum(len(c) for c in chunks) == expected_samples(either_engine, SENTENCE)
    assert all(np.isfinite(c).all() and np.abs(c).max() > 0 for c in chunks)
    assert state.stream is None and state.batched is None
    assert either_engine.active_streams == 0


@pytest.mark.parametrize(("first_hop_tokens", "early"), [(16, False), (10, True)])
def test_chunked_flow_with_unbounded_context_equals_one_pass(
    speak_engine: CosyVoiceEngine, first_hop_tokens: int, early: bool
):
    """The hop grid keeps the flow's chunk masks intact: joined hops equal a single pass.

    With ``context_tokens=None`` (upstream's full recompute) each hop's mel must match the
    whole utterance's mel: a hop ending off the 25-token grid, or a window start off it,
    changes what the decoder's chunked attention sees. The one exception is an early first
    hop (30 prompt tokens: the grid line is 20 tokens in, too far after 10): its frames lack
    the rest of their chunk, and the catch-up hop after it renders the frames the vocoder
    still holds again, exactly; only the frames sent before those may differ.
    """
    model, engine_state = speak_engine.model, state_for(speak_engine, speaker="tiny-b")
    prompt, chunk = engine_state.prompt.flow, speak_engine.chunk
    assert prompt.length == 30
    tokens = np.random.default_rng(0).integers(0, 6561, 80).astype(np.int32)
    whole = flow_mel(model.flow, prompt, tokens, 0, len(tokens), True, None, chunk).numpy()
    schedule, start = HopSchedule(chunk, prompt.length, first_hop_tokens), 0
    joined = np.full_like(whole, np.nan)
    lookahead, hops = model.flow.pre_lookahead_len, 0

    def place(first: int, mel: torch.Tensor) -> None:
        joined[:, :, 2 * first : 2 * first + mel.shape[2]] = mel.numpy()

    while start + schedule.next_hop() + lookahead <= len(tokens):
        end, first = start + schedule.taken[-1], start - schedule.redo_tokens
        place(
            first,
            flow_mel(model.flow, prompt, tokens[: end + lookahead], first, end, False, None, chunk),
        )
        start, hops = end, hops + 1
    first = start - schedule.redo_tokens
    place(first, flow_mel(model.flow, prompt, tokens, first, len(tokens), True, None, chunk))
    assert hops >= 2 and (schedule.taken[0] == first_hop_tokens) is early
    sent_early = 2 * (schedule.taken[0] - HELD_TOKENS) if early else 0
    np.testing.assert_allclose(joined[:, :, sent_early:], whole[:, :, sent_early:], atol=1e-4)
    assert np.isfinite(joined).all()


def test_a_catch_up_hop_vocodes_its_new_rendering_of_the_held_frames(
    speak_engine: CosyVoiceEngine,
):
    """After an early first hop the next mel starts with the held frames rendered again: the
    vocoder uses those in place of its copy, over the held excitation, and crossfades from
    the held audio, exactly as if the new frames had been held all along."""
    hift = speak_engine.model.hift
    early = torch.randn(1, 80, 20, generator=torch.Generator().manual_seed(1))
    catch_up = torch.randn(1, 80, 38, generator=torch.Generator().manual_seed(2))
    caches = [VocoderCache(), VocoderCache()]
    for cache in caches:
        torch.manual_seed(3)  # HiFT's source noise
        sent = vocode(hift, cache, early, final=False)
        assert len(sent) == (20 - MEL_CACHE_FRAMES) * SAMPLES_PER_FRAME
    caches[0].replace_held_mel()
    caches[1].mel = catch_up[:, :, :MEL_CACHE_FRAMES]  # as if held from the start
    results = []
    for cache, mel in zip(caches, (catch_up, catch_up[:, :, MEL_CACHE_FRAMES:]), strict=True):
        torch.manual_seed(4)
        results.append(vocode(hift, cache, mel, final=True))
    np.testing.assert_array_equal(results[0], results[1])
    assert len(results[0]) == 38 * SAMPLES_PER_FRAME


def test_concurrent_sessions_keep_their_own_hop_schedules_and_caches(
    either_engine: CosyVoiceEngine,
):
    """Two sessions with different prompts synthesise at once, each on its own schedule.

    Upstream keeps the hop size on the model object all sessions share, so one session's
    schedule leaks into the other's. Here session B (a 30-token prompt, first_hop_tokens 4)
    must take 20 tokens first (to the grid) and session A (no prompt, first_hop_tokens 10) 10
    and then 15 (an early first hop, then up to the grid), whatever runs when; and each
    produces exactly the audio its own tokens call for.
    """
    a = state_for(either_engine, speaker="tiny-a", first_hop_tokens=10)
    b = state_for(either_engine, speaker="tiny-b", first_hop_tokens=4)
    texts = {id(a): SENTENCE, id(b): SENTENCE + " And a little more."}
    results: dict[int, list[np.ndarray]] = {}
    seen_streams: dict[int, set[int]] = {id(a): set(), id(b): set()}

    def run(state) -> None:
        chunks = []
        for chunk in either_engine.synthesize(state, texts[id(state)], threading.Event()):
            utterance = state.stream or state.batched
            seen_streams[id(state)].add(id(utterance.vocoder))
            chunks.append(chunk)
        results[id(state)] = chunks

    threads = [threading.Thread(target=run, args=(s,)) for s in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    expected_a = HopSchedule(either_engine.chunk, 0, 10)
    expected_b = HopSchedule(either_engine.chunk, 30, 4)
    assert a.last_hops == tuple(expected_a.next_hop() for _ in a.last_hops)
    assert b.last_hops == tuple(expected_b.next_hop() for _ in b.last_hops)
    assert a.last_hops[:2] == (10, 15) and b.last_hops[0] == 20
    assert seen_streams[id(a)].isdisjoint(seen_streams[id(b)])
    for state in (a, b):
        produced = sum(len(c) for c in results[id(state)])
        assert produced == expected_samples(either_engine, texts[id(state)])
    assert not hasattr(either_engine.model.flow, "token_hop_len")


def test_cancel_stops_the_llm_within_one_token_and_frees_the_caches(
    sequential_engine: CosyVoiceEngine,
):
    state = state_for(sequential_engine, speaker="tiny-a")
    cancel = threading.Event()
    chunks = sequential_engine.synthesize(state, SENTENCE * 3, cancel)
    next(chunks)
    stream = state.stream
    assert stream is not None and stream.tokens.alive
    produced = len(stream.tokens)
    cancel.set()
    began = time.monotonic()
    remaining = list(chunks)
    assert remaining == []
    assert not stream.tokens.alive
    assert time.monotonic() - began < 1.0
    assert stream.tokens.steps_after_stop <= 1
    assert produced <= len(stream.tokens) < 2 * len(text_ids(sequential_engine.model, SENTENCE * 3))
    assert state.stream is None and sequential_engine.active_streams == 0
    ref = weakref.ref(stream)
    del stream
    gc.collect()
    assert ref() is None, "the utterance's token list and caches are still referenced"


def test_an_error_in_the_flow_ends_the_utterance_within_a_second(
    either_engine: CosyVoiceEngine, monkeypatch: pytest.MonkeyPatch
):
    def broken(*args, **kwargs):
        raise RuntimeError("injected flow failure")

    monkeypatch.setattr(either_engine.model.flow.decoder.estimator, "forward", broken)
    state = state_for(either_engine)
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="injected flow failure"):
        list(either_engine.synthesize(state, SENTENCE, threading.Event()))
    assert time.monotonic() - began < ERROR_DEADLINE_S
    assert either_engine.active_streams == 0


def test_an_error_in_the_llm_reaches_the_consumer_instead_of_hanging_it(
    either_engine: CosyVoiceEngine, monkeypatch: pytest.MonkeyPatch
):
    """Upstream's consumer polls for tokens forever when its LLM thread dies."""

    def broken(*args, **kwargs):
        raise RuntimeError("injected LLM failure")

    monkeypatch.setattr(either_engine.model.llm.llm_decoder, "forward", broken)
    state = state_for(either_engine)
    began = time.monotonic()
    with pytest.raises(LlmFailed, match="injected LLM failure"):
        list(either_engine.synthesize(state, SENTENCE, threading.Event()))
    assert time.monotonic() - began < ERROR_DEADLINE_S


class CancelAfter(threading.Event):
    """A cancel event that sets itself on its ``checks``-th look: an interrupt mid-LLM."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self._left = checks

    def is_set(self) -> bool:
        self._left -= 1
        if self._left <= 0:
            self.set()
        return super().is_set()


def test_fifty_sessions_leave_nothing_behind(either_engine: CosyVoiceEngine):
    """Open, speak and close 50 sessions; 45 are interrupted while their LLM runs.

    Upstream keeps per-utterance entries in dicts on the shared model, keyed by a uuid, and
    removes them only when an utterance runs to its end.
    """
    before = set(vars(either_engine))
    refs = []
    for index in range(50):
        state = state_for(either_engine, speaker=("tiny-a", "tiny-b")[index % 2])
        cancel = CancelAfter(3) if index % 10 else threading.Event()
        list(either_engine.synthesize(state, "Hi there.", cancel))
        either_engine.close_state(state)
        refs.append(weakref.ref(state))
        del state
    gc.collect()
    assert either_engine.active_streams == 0
    assert set(vars(either_engine)) == before
    assert not [t for t in threading.enumerate() if t.name == "cosyvoice-llm"]
    assert all(ref() is None for ref in refs)


def test_a_prompt_clip_is_analysed_once_and_clones_the_voice(either_engine: CosyVoiceEngine):
    state = state_for(either_engine, speaker="tiny-a")
    clip = espeak("This is my voice, please copy it.", rate=16_000)
    either_engine.set_prompt(state, clip, 16_000, "This is my voice, please copy it.")
    prompt = state.prompt
    seconds = len(clip) / 16_000
    assert state.speaker == "prompt"
    assert abs(prompt.flow.length - 25 * seconds) <= 2
    assert prompt.flow.feat.shape == (1, 2 * prompt.flow.length, 80)
    assert prompt.flow.embedding.shape == (1, 192) and prompt.text.size > 0
    produced = sum(len(c) for c in either_engine.synthesize(state, SENTENCE, threading.Event()))
    assert produced == expected_samples(either_engine, SENTENCE)
    grid_reached = prompt.flow.length + sum(state.last_hops[:2])  # see schedule.py
    assert grid_reached % either_engine.chunk == 0
    with pytest.raises(PromptError):
        either_engine.set_prompt(state, clip[:1000], 16_000, "too short")


def test_bistream_speech_starts_before_the_text_is_complete(speak_engine: CosyVoiceEngine):
    """Text pieces arrive over time (as from a language model); audio starts from the first.

    The pieces come through a queue the test feeds slowly; the first chunk must be ready
    while later pieces have not been sent yet, and the whole text must be spoken: the tiny
    LLM speaks exactly fifteen tokens per five text tokens, then stops at its end token.
    """
    pieces = [word + " " for word in (SENTENCE + " " + SENTENCE).split()]
    feed: queue.Queue[str | None] = queue.Queue()
    fed: list[float] = []

    def text_source():
        while (piece := feed.get(timeout=10)) is not None:
            yield piece

    def writer() -> None:
        for piece in pieces:
            feed.put(piece)
            fed.append(time.monotonic())
            time.sleep(0.15)
        feed.put(None)

    state = state_for(speak_engine, speaker="tiny-a")
    threading.Thread(target=writer, daemon=True).start()
    chunks = list(speak_engine.synthesize_pieces(state, text_source(), threading.Event()))
    assert state.first_chunk_at is not None and state.first_chunk_at < fed[-1]
    text_tokens = sum(len(text_ids(speak_engine.model, piece)) for piece in pieces)
    spoken = sum(len(c) for c in chunks) // SAMPLES_PER_TOKEN
    assert spoken == 15 * (text_tokens // 5)
    assert speak_engine.active_streams == 0


def test_a_listener_that_leaves_stops_the_llm_without_a_cancel(sequential_engine: CosyVoiceEngine):
    """Closing the chunk iterator (the caller went away) stops the worker too.

    Upstream's LLM thread runs to the end of the text whoever is still listening.
    """
    state = state_for(sequential_engine, speaker="tiny-b")
    chunks = sequential_engine.synthesize(state, SENTENCE * 3, threading.Event())
    next(chunks)
    stream = state.stream
    assert stream is not None
    chunks.close()
    assert not stream.tokens.alive
    assert len(stream.tokens) < 2 * len(text_ids(sequential_engine.model, SENTENCE * 3))
    assert state.stream is None and sequential_engine.active_streams == 0


def test_closing_the_session_mid_utterance_ends_synthesis(sequential_engine: CosyVoiceEngine):
    """``close_state`` from another thread (the session ended) while a chunk is awaited."""
    state = state_for(sequential_engine, speaker="tiny-a")
    chunks = sequential_engine.synthesize(state, SENTENCE * 3, threading.Event())
    next(chunks)
    stream = state.stream
    assert stream is not None
    calls_before = len(stream.schedule.taken)
    sequential_engine.close_state(state)
    assert list(chunks) == []
    assert not stream.tokens.alive and len(stream.schedule.taken) <= calls_before + 1
    assert sequential_engine.active_streams == 0
