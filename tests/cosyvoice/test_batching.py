"""The batched CosyVoice worker: each utterance as if alone, one step for all, clean exits."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest
import torch

from media.engines.cosyvoice.batch_llm import (
    FIRST_CAPACITY,
    FIRST_ROWS,
    DecodeGraph,
    SlotCache,
    decode_step,
    prefill,
)
from media.engines.cosyvoice.batcher import GATHER_STEPS, CosyVoiceBatcher, Utterance
from media.engines.cosyvoice.flow_batch import FlowHop, flow_mel_batch
from media.engines.cosyvoice.flow_window import flow_mel
from media.engines.cosyvoice.prompts import SpeakerPrompt, text_ids
from media.engines.cosyvoice.sampling import new_generator
from media.engines.cosyvoice.schedule import HopSchedule
from media.engines.cosyvoice.speak import SAMPLES_PER_TOKEN, CosyVoiceEngine
from media.engines.cosyvoice.tokens import LlmFailed, LlmRequest, generate_tokens
from tests.cosyvoice.conftest import SENTENCE

TEXTS = (
    "Hello there, how are you today?",
    SENTENCE,
    "Numbers like 42.",
    "Streaming speech should start long before the sentence is finished, said the fox.",
    "A small tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
)


def speakers(engine: CosyVoiceEngine) -> list[SpeakerPrompt]:
    return [
        engine.new_state(engine.validate_options({"speaker": name})).prompt
        for name in ("tiny-a", "tiny-b")
    ]


def request_for(engine: CosyVoiceEngine, text: str, prompt: SpeakerPrompt) -> LlmRequest:
    return LlmRequest(
        text=text_ids(engine.model, text), prompt_text=prompt.text, prompt_tokens=prompt.tokens
    )


def alone(engine: CosyVoiceEngine, request: LlmRequest, seed: int) -> list[int]:
    """The tokens the sequential path draws for ``request`` with ``seed``."""
    return list(generate_tokens(engine.model.llm, request, new_generator(seed), lambda: False))


def start(
    batcher: CosyVoiceBatcher,
    engine: CosyVoiceEngine,
    request: LlmRequest,
    prompt: SpeakerPrompt,
    seed: int,
    cancel: threading.Event | None = None,
) -> Utterance:
    schedule = HopSchedule(engine.chunk, prompt.flow.length)
    return batcher.speak(
        request, prompt, new_generator(seed), schedule, cancel or threading.Event()
    )


def read_all(utterances: list[Utterance]) -> list[np.ndarray]:
    audio: list[np.ndarray] = [np.zeros(0, np.float32)] * len(utterances)

    def read(index: int) -> None:
        chunks = list(utterances[index].audio())
        audio[index] = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(utterances))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return audio


def test_hops_of_different_lengths_in_one_flow_call_equal_each_alone(
    speak_engine: CosyVoiceEngine,
):
    """Right-padded rows, two prompts (0 and 30 tokens), first, middle and final hops."""
    flow, chunk = speak_engine.model.flow, speak_engine.chunk
    plain, prompted = (prompt.flow for prompt in speakers(speak_engine))
    tokens = np.random.default_rng(3).integers(0, 6561, 400).astype(np.int32)
    hops = [
        FlowHop(plain, tokens, 0, 25, False),
        FlowHop(prompted, tokens, 0, 20, False),
        FlowHop(plain, tokens, 25, 50, False),
        FlowHop(prompted, tokens, 95, 195, False),
        FlowHop(plain, tokens, 150, 163, True),
        FlowHop(prompted, tokens, 245, 345, True),
    ]
    batched = flow_mel_batch(flow, hops, speak_engine.context_tokens, chunk)
    for hop, mel in zip(hops, batched, strict=True):
        window = tokens[: hop.end + (0 if hop.final else flow.pre_lookahead_len)]
        single = flow_mel(
            flow,
            hop.prompt,
            window,
            hop.start,
            hop.end,
            hop.final,
            speak_engine.context_tokens,
            chunk,
        )
        assert mel.shape == single.shape == (1, 80, 2 * (hop.end - hop.start))
        np.testing.assert_allclose(mel.numpy(), single.numpy(), atol=1e-4)


def new_cache(body: torch.nn.Module) -> SlotCache:
    config = body.config
    return SlotCache(
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.hidden_size // config.num_attention_heads,
        body.embed_tokens.weight,
    )


def stepper(kind: str, body: torch.nn.Module, cache: SlotCache) -> Any:
    if kind == "dynamic":
        return lambda inputs: decode_step(body, cache, inputs)
    return DecodeGraph(body, cache, capture=False)  # the graph's step and buffers, no CUDA


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_batched_step_equals_the_library_forward_for_each_row(
    speak_engine: CosyVoiceEngine, kind: str
):
    """Rows with caches of different lengths, more rows than the cache first holds and one
    about to outgrow its positions; then one leaves and the others step on. The static
    form steps every row of the capacity over all of it, the rows not in use ignored."""
    body = speak_engine.model.llm.llm.model.model
    hidden_size = body.config.hidden_size
    cache = new_cache(body)
    step = stepper(kind, body, cache)
    generator = torch.Generator().manual_seed(0)
    library_caches = []
    lengths = (7, 30, 12, FIRST_CAPACITY - 2, 3)
    with torch.inference_mode():
        for length in lengths:
            inputs = torch.randn(1, length, hidden_size, generator=generator)
            _, keys, values = prefill(body, inputs)
            cache.add(keys, values)
            library_caches.append(body(inputs_embeds=inputs, use_cache=True).past_key_values)
        assert cache.capacity_rows > FIRST_ROWS
        for index in range(4):
            if index == 2:
                assert cache.remove(0) == 4  # the last row moves into the freed one
                library_caches = [library_caches[4], *library_caches[1:4]]
            new = torch.randn(cache.rows, hidden_size, generator=generator)
            batched = step(new)
            assert batched.shape == (cache.rows, hidden_size)
            for row, past in enumerate(library_caches):
                result = body(
                    inputs_embeds=new[row][None, None], past_key_values=past, use_cache=True
                )
                np.testing.assert_allclose(
                    batched[row].numpy(), result.last_hidden_state[0, -1].numpy(), atol=1e-4
                )
    assert cache.capacity == 2 * FIRST_CAPACITY  # a row outgrew it during the steps
    assert cache.lengths == [3 + 4, 30 + 4, 12 + 4, FIRST_CAPACITY - 2 + 4]
    assert cache.positions[: cache.rows].tolist() == cache.lengths
    assert cache.positions[cache.rows :].eq(0).all()


@pytest.mark.parametrize("kind", ["static", "graph"])
def test_a_batcher_with_a_static_step_draws_what_the_sequential_path_draws(
    speak_engine: CosyVoiceEngine, kind: str
):
    """``llm_step=static`` through the whole loop: every token as each utterance alone;
    ``graph`` is refused on a CPU, with a reason."""
    if kind == "graph":
        with pytest.raises(ValueError, match="CUDA"):
            CosyVoiceBatcher(
                speak_engine.model, speak_engine.context_tokens, speak_engine.chunk, llm_step=kind
            )
        return
    batcher = CosyVoiceBatcher(
        speak_engine.model, speak_engine.context_tokens, speak_engine.chunk, llm_step=kind
    )
    try:
        prompts = speakers(speak_engine)
        requests = [request_for(speak_engine, text, prompts[i % 2]) for i, text in enumerate(TEXTS)]
        utterances = [
            start(batcher, speak_engine, request, prompts[i % 2], 20 + i)
            for i, request in enumerate(requests[:5])
        ]
        read_all(utterances)
        for index, utterance in enumerate(utterances):
            assert utterance.tokens == alone(speak_engine, requests[index], 20 + index), index
        assert batcher.steps < sum(len(u.tokens) for u in utterances)
    finally:
        batcher.close()


def test_utterances_that_join_and_leave_speak_what_they_would_alone(
    speak_engine: CosyVoiceEngine,
):
    """Six utterances, two voices, joining at different times and ending at different
    lengths: each draws exactly the tokens the sequential path draws with its seed, and its
    audio has exactly the samples its tokens call for, while the steps were shared."""
    batcher = speak_engine.batcher
    assert batcher is not None
    prompts = speakers(speak_engine)
    requests = [request_for(speak_engine, text, prompts[i % 2]) for i, text in enumerate(TEXTS)]
    steps_before = batcher.steps
    utterances = [
        start(batcher, speak_engine, requests[i], prompts[i % 2], 10 + i) for i in range(3)
    ]
    time.sleep(0.05)  # the others join a batch already under way
    utterances += [
        start(batcher, speak_engine, requests[i], prompts[i % 2], 10 + i)
        for i in range(3, len(TEXTS))
    ]
    audio = read_all(utterances)
    for index, (utterance, request) in enumerate(zip(utterances, requests, strict=True)):
        assert utterance.tokens == alone(speak_engine, request, 10 + index), index
        assert len(audio[index]) == len(utterance.tokens) * SAMPLES_PER_TOKEN
        assert np.isfinite(audio[index]).all() and np.abs(audio[index]).max() > 0
    tokens = sum(len(u.tokens) for u in utterances)
    assert batcher.steps - steps_before < 0.5 * tokens
    assert batcher.active == 0


@pytest.mark.parametrize(
    ("lag", "shared"), [(1, True), (GATHER_STEPS, True), (GATHER_STEPS + 2, False)]
)
def test_first_hops_a_few_steps_apart_share_one_render(
    speak_engine: CosyVoiceEngine, monkeypatch: pytest.MonkeyPatch, lag: int, shared: bool
):
    """Two callers saying the same thing, the second admitted ``lag`` steps after the first:
    within ``GATHER_STEPS`` the first hop ready first waits for the other and one render
    makes both; further apart, it does not wait (nobody waits more than a few steps)."""
    batcher = speak_engine.batcher
    assert batcher is not None
    prompt = speakers(speak_engine)[0]
    request = request_for(speak_engine, SENTENCE, prompt)
    firsts_per_render: list[int] = []
    render, step = batcher._render, batcher._step
    second_queued = threading.Event()
    steps = 0

    def recording_render(utterances: list[Utterance]) -> None:
        firsts_per_render.append(sum(1 for u in utterances if u.vocoded == 0))
        render(utterances)

    def step_then_hold() -> None:  # the worker stops after ``lag`` steps until B is queued
        nonlocal steps
        step()
        steps += 1
        if steps == lag:
            second_queued.wait(10)

    monkeypatch.setattr(batcher, "_render", recording_render)
    monkeypatch.setattr(batcher, "_step", step_then_hold)
    first = start(batcher, speak_engine, request, prompt, 1)
    deadline = time.monotonic() + 10
    while steps < lag and time.monotonic() < deadline:
        time.sleep(0.001)
    second = start(batcher, speak_engine, request, prompt, 2)
    second_queued.set()
    audio = read_all([first, second])
    assert all(len(a) for a in audio)
    assert (firsts_per_render[0] == 2) is shared, firsts_per_render
    assert sum(firsts_per_render) == 2
    assert batcher.active == 0


def test_a_cancel_in_the_batch_stops_that_utterance_within_one_step(
    speak_engine: CosyVoiceEngine,
):
    batcher = speak_engine.batcher
    assert batcher is not None
    prompts = speakers(speak_engine)
    long_request = request_for(speak_engine, SENTENCE * 3, prompts[0])
    others = [request_for(speak_engine, TEXTS[i], prompts[1]) for i in (1, 3)]
    cancel = threading.Event()
    victim = start(batcher, speak_engine, long_request, prompts[0], 5, cancel)
    rest = [
        start(batcher, speak_engine, request, prompts[1], 20 + i)
        for i, request in enumerate(others)
    ]
    chunks = victim.audio()
    next(chunks)
    cancel.set()
    began = time.monotonic()
    assert list(chunks) == []
    assert time.monotonic() - began < 1.0
    audio = read_all(rest)
    assert victim.tokens_after_stop <= 1
    assert len(victim.tokens) < 2 * len(long_request.text)
    for index, (utterance, request) in enumerate(zip(rest, others, strict=True)):
        assert utterance.tokens == alone(speak_engine, request, 20 + index)
        assert len(audio[index]) == len(utterance.tokens) * SAMPLES_PER_TOKEN
    assert batcher.active == 0
    ref = weakref.ref(victim)
    del victim, chunks
    gc.collect()
    assert ref() is None, "the cancelled utterance's tokens and caches are still referenced"


@pytest.mark.parametrize("how", ["listener leaves", "session closes"])
def test_an_utterance_whose_listener_is_gone_leaves_the_batch(
    speak_engine: CosyVoiceEngine, how: str
):
    batcher = speak_engine.batcher
    assert batcher is not None
    state = speak_engine.new_state(speak_engine.validate_options({"seed": 3}))
    chunks = speak_engine.synthesize(state, SENTENCE * 3, threading.Event())
    next(chunks)
    utterance = state.batched
    assert utterance is not None
    if how == "listener leaves":
        chunks.close()
    else:
        speak_engine.close_state(state)
        assert list(chunks) == []
    deadline = time.monotonic() + 1.0
    while batcher.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher.active == 0
    assert len(utterance.tokens) < 2 * len(text_ids(speak_engine.model, SENTENCE * 3))
    assert state.batched is None and speak_engine.active_streams == 0


def test_a_failed_step_ends_its_utterances_and_the_worker_serves_the_next(
    speak_engine: CosyVoiceEngine, monkeypatch: pytest.MonkeyPatch
):
    batcher = speak_engine.batcher
    assert batcher is not None
    prompts = speakers(speak_engine)
    calls = {"made": 0}
    real = speak_engine.model.llm.llm_decoder.forward

    def fails_once(*args, **kwargs):
        calls["made"] += 1
        if calls["made"] == 3:  # the prefill and one step went well
            raise RuntimeError("injected step failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(speak_engine.model.llm.llm_decoder, "forward", fails_once)
    failed = start(
        batcher, speak_engine, request_for(speak_engine, TEXTS[0], prompts[0]), prompts[0], 1
    )
    with pytest.raises(LlmFailed, match="injected step failure"):
        list(failed.audio())
    assert len(failed.tokens) == 2
    monkeypatch.undo()
    request = request_for(speak_engine, TEXTS[2], prompts[1])
    after = start(batcher, speak_engine, request, prompts[1], 2)
    assert len(read_all([after])[0]) == len(alone(speak_engine, request, 2)) * SAMPLES_PER_TOKEN
    assert batcher.active == 0
