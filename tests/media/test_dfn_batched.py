"""The batched DeepFilterNet3 (``media.engines.dfn``) against the C library engine, and its slots.

Equivalence is measured as the SNR of the difference: the C engine's output power over the
power of (batched - C), both with their 30 ms delay. On this project's machine it is 133-136 dB
(the two runtimes agree to float32 rounding), so the bar here, 60 dB, is far above the 30 dB
asked for and still catches a step done differently: a frame off in the look-ahead gives
-3 dB. Smaller slips (the post filter also on the Nyquist bin: 100 dB) are caught by the DSP
test at the end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from media.engines import deepfilter
from media.engines.deepfilter import DeepFilterEngine
from media.engines.dfn import BatchedDeepFilter, SlotsExhausted
from media.engines.dfn.batch import MIN_BATCH
from media.engines.dfn.dsp import Dsp, DspConfig
from media.engines.dfn.graphs import DeepFilterModel, GraphSession, load_model, read_archive
from peer.speech import SpeechFixture, add_white_noise

HOP = 480
DELAY = 1440  # 30 ms at 48 kHz, both engines
MIN_EQUIVALENCE_DB = 60.0
STREAMS = 16
EVENT_HOP = 120  # when a stream is reset, closed or joins in the slot tests
SLOT_TEST_HOPS = 300  # 3 s per stream in the slot tests
OPTION_SECONDS = 6.0  # the option tests use the first two sentences


@pytest.fixture(scope="module")
def model() -> DeepFilterModel:
    return load_model()


@pytest.fixture(scope="module")
def c_engine() -> Iterator[DeepFilterEngine]:
    engine = deepfilter.load(pool_size=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def noisy(speech: SpeechFixture) -> np.ndarray:
    signal = add_white_noise(speech.clean, snr_db=5.0)
    return signal[: signal.size // HOP * HOP]


@pytest.fixture(scope="module")
def c_output(c_engine: DeepFilterEngine, noisy: np.ndarray) -> np.ndarray:
    return _c_denoise(c_engine, noisy)


def _c_denoise(engine: DeepFilterEngine, signal: np.ndarray, **options: float) -> np.ndarray:
    state = engine.new_state(engine.validate_options(options))
    try:
        return engine.process(state, signal)[0]
    finally:
        engine.close_state(state)


def _hops(signal: np.ndarray) -> np.ndarray:
    return signal[: signal.size // HOP * HOP].reshape(-1, HOP)


def _alone(filt: BatchedDeepFilter, signal: np.ndarray, **options: float) -> np.ndarray:
    slot = filt.open_slot(**options)
    try:
        return np.concatenate([filt.process([slot], hop[None])[0] for hop in _hops(signal)])
    finally:
        filt.close_slot(slot)


def _difference_snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    reference = reference.astype(np.float64)
    error = other.astype(np.float64) - reference
    return float(10 * np.log10(np.sum(reference**2) / max(np.sum(error**2), 1e-30)))


def _level_db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(x, dtype=np.float64)) + 1e-20))


def _streams(noisy: np.ndarray, count: int, hops: int) -> np.ndarray:
    """``count`` different streams [count, hops, HOP]: the fixture shifted, with its own noise."""
    rng = np.random.default_rng(11)
    length = hops * HOP
    streams = [np.roll(noisy, -index * 37 * HOP)[:length] for index in range(count)]
    noise = rng.standard_normal((count, length)).astype(np.float32) * 0.01
    return (np.stack(streams) + noise).astype(np.float32).reshape(count, hops, HOP)


def _run_batch(
    filt: BatchedDeepFilter,
    streams: np.ndarray,
    event: str | None = None,
    victim: int = 5,
) -> dict[int, np.ndarray]:
    """Every stream through one filter, all in one call per hop; at ``EVENT_HOP`` the
    ``victim`` stream is reset or closed. Returns each stream's output hops."""
    slots = [filt.open_slot() for _ in range(len(streams))]
    outputs: dict[int, list[np.ndarray]] = {index: [] for index in range(len(streams))}
    live = list(range(len(streams)))
    for hop in range(streams.shape[1]):
        if hop == EVENT_HOP and event == "reset":
            filt.reset_slot(slots[victim])
        elif hop == EVENT_HOP and event == "close":
            filt.close_slot(slots[victim])
            live.remove(victim)
        out = filt.process([slots[i] for i in live], streams[live, hop])
        for row, index in enumerate(live):
            outputs[index].append(out[row])
    return {index: np.stack(hops) for index, hops in outputs.items()}


# Equivalence with the C library


def test_alone_matches_the_c_library(
    model: DeepFilterModel, noisy: np.ndarray, c_output: np.ndarray, speech: SpeechFixture
) -> None:
    out = _alone(BatchedDeepFilter(model=model), noisy)
    assert out.shape == c_output.shape
    assert _difference_snr_db(c_output, out) >= MIN_EQUIVALENCE_DB
    # And it is the denoiser, not a pass-through: the pauses lose their white noise.
    pauses = ~speech.speech_mask[: noisy.size - DELAY]
    assert _level_db(out[DELAY:][pauses]) < _level_db(noisy[:-DELAY][pauses]) - 25


def test_in_a_batch_of_8_matches_the_c_library(
    model: DeepFilterModel, noisy: np.ndarray, c_output: np.ndarray
) -> None:
    filt = BatchedDeepFilter(model=model)
    others = _streams(noisy, 7, noisy.size // HOP)
    slots = [filt.open_slot() for _ in range(8)]
    target = 5  # in the middle of the batch
    streams = np.insert(others, target, _hops(noisy), axis=0)
    out = np.stack([filt.process(slots, streams[:, hop]) for hop in range(streams.shape[1])])
    assert _difference_snr_db(c_output, out[:, target].reshape(-1)) >= MIN_EQUIVALENCE_DB


def test_one_call_of_each_graph_per_hop(
    model: DeepFilterModel, noisy: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    filt = BatchedDeepFilter(model=model)
    slots = [filt.open_slot() for _ in range(8)]
    calls: list[str] = []
    original = GraphSession.run

    def counted(self: GraphSession, feeds: Any) -> Any:
        calls.append(self.graph.name)
        return original(self, feeds)

    monkeypatch.setattr(GraphSession, "run", counted)
    filt.process(slots, _streams(noisy, 8, 1)[:, 0])
    assert sorted(calls) == ["df_dec", "enc", "erb_dec"]


# Options, as the C engine has them


def test_attenuation_limit_caps_the_suppression_like_the_c_engine(
    model: DeepFilterModel, c_engine: DeepFilterEngine, noisy: np.ndarray, speech: SpeechFixture
) -> None:
    part = noisy[: int(OPTION_SECONDS * 48_000) // HOP * HOP]
    out = _alone(BatchedDeepFilter(model=model), part, atten_lim_db=6.0)
    pauses = ~speech.speech_mask[DELAY : part.size]
    pauses[:48_000] = False  # the first second: the running norms settle
    reduction = _level_db(part[:-DELAY][pauses]) - _level_db(out[DELAY:][pauses])
    assert abs(reduction - 6.0) < 1.0
    reference = _c_denoise(c_engine, part, atten_lim_db=6.0)
    assert _difference_snr_db(reference, out) >= MIN_EQUIVALENCE_DB


def test_post_filter_runs_and_matches_the_c_engine(
    model: DeepFilterModel, c_engine: DeepFilterEngine, noisy: np.ndarray, speech: SpeechFixture
) -> None:
    part = noisy[: int(OPTION_SECONDS * 48_000) // HOP * HOP]
    filt = BatchedDeepFilter(model=model)
    plain = _alone(filt, part)
    filtered = _alone(filt, part, post_filter_beta=0.02)
    reference = _c_denoise(c_engine, part, post_filter_beta=0.02)
    assert _difference_snr_db(reference, filtered) >= MIN_EQUIVALENCE_DB
    # The post filter attenuates what the model only half removed: quieter pauses.
    pauses = ~speech.speech_mask[DELAY : part.size]
    assert _level_db(filtered[DELAY:][pauses]) < _level_db(plain[DELAY:][pauses]) - 0.5


def test_streams_with_other_options_in_the_same_call_do_not_mix(
    model: DeepFilterModel, noisy: np.ndarray
) -> None:
    streams = _streams(noisy, 2, 80)
    options: list[dict[str, float]] = [{}, {"atten_lim_db": 12.0, "post_filter_beta": 0.03}]
    filt = BatchedDeepFilter(model=model)
    alone = [
        _alone(filt, stream.reshape(-1), **opts)
        for stream, opts in zip(streams, options, strict=True)
    ]
    slots = [filt.open_slot(**opts) for opts in options]
    together = np.stack([filt.process(slots, streams[:, hop]) for hop in range(80)])
    for index in range(2):
        assert np.array_equal(together[:, index].reshape(-1), alone[index])


def test_options_out_of_range_are_refused(model: DeepFilterModel) -> None:
    filt = BatchedDeepFilter(model=model)
    for bad in ({"atten_lim_db": -1.0}, {"atten_lim_db": 101.0}, {"post_filter_beta": 0.06}):
        with pytest.raises(ValueError):
            filt.open_slot(**bad)
    assert filt.open_slots == 0


# Slots


def test_a_reset_elsewhere_leaves_the_other_streams_bit_identical(
    model: DeepFilterModel, noisy: np.ndarray
) -> None:
    streams = _streams(noisy, STREAMS, SLOT_TEST_HOPS)
    baseline = _run_batch(BatchedDeepFilter(model=model), streams)
    reset = _run_batch(BatchedDeepFilter(model=model), streams, event="reset")
    for index in range(STREAMS):
        if index != 5:
            assert np.array_equal(reset[index], baseline[index]), index
    # The reset stream itself restarted: it differs from the uninterrupted run.
    assert not np.array_equal(reset[5][EVENT_HOP:], baseline[5][EVENT_HOP:])


def test_a_close_elsewhere_leaves_the_other_streams_bit_identical(
    model: DeepFilterModel, noisy: np.ndarray
) -> None:
    streams = _streams(noisy, STREAMS, SLOT_TEST_HOPS)
    baseline = _run_batch(BatchedDeepFilter(model=model), streams)
    # Slot 5 is in the middle: the ten streams after it move up one place in the batch.
    closed = _run_batch(BatchedDeepFilter(model=model), streams, event="close")
    assert len(closed[5]) == EVENT_HOP
    for index in range(STREAMS):
        expected = baseline[index][:EVENT_HOP] if index == 5 else baseline[index]
        assert np.array_equal(closed[index], expected), index


def test_a_late_joiner_gets_what_it_gets_alone(model: DeepFilterModel, noisy: np.ndarray) -> None:
    # Bit-identical, not within a tolerance: onnxruntime's kernels give every row the same
    # bits at any batch size of MIN_BATCH rows or more, and a call never runs fewer.
    streams = _streams(noisy, STREAMS, SLOT_TEST_HOPS)
    joiner = streams[-1, EVENT_HOP:].reshape(-1)
    alone = _alone(BatchedDeepFilter(model=model), joiner)

    filt = BatchedDeepFilter(model=model)
    slots = [filt.open_slot() for _ in range(STREAMS - 1)]
    joined: list[np.ndarray] = []
    for hop in range(SLOT_TEST_HOPS):
        if hop == EVENT_HOP:
            slots.append(filt.open_slot())
        out = filt.process(slots, streams[: len(slots), hop])
        if hop >= EVENT_HOP:
            joined.append(out[-1])
    assert np.array_equal(np.concatenate(joined), alone)


def test_a_stream_missing_from_some_calls_does_not_move(
    model: DeepFilterModel, noisy: np.ndarray
) -> None:
    # A late session is simply left out of a tick and sent with a later one: its output is
    # the same as if it had never been late, and so are the others'.
    streams = _streams(noisy, 4, 60)
    baseline = _run_batch(BatchedDeepFilter(model=model), streams)
    filt = BatchedDeepFilter(model=model)
    slots = [filt.open_slot() for _ in range(4)]
    late: list[np.ndarray] = []
    others: list[np.ndarray] = []
    for hop in range(60):
        if 20 <= hop < 30:  # stream 1 (slot 1) misses ten ticks...
            others.append(filt.process([slots[0], slots[2], slots[3]], streams[[0, 2, 3], hop]))
            continue
        if hop == 30:  # ...and catches up alone
            late.extend(filt.process([slots[1]], streams[1, h][None])[0] for h in range(20, 30))
        out = filt.process(slots, streams[:, hop])
        late.append(out[1])
        others.append(out[[0, 2, 3]])
    assert np.array_equal(np.stack(late), baseline[1])
    got = np.stack(others)
    for column, index in enumerate((0, 2, 3)):
        assert np.array_equal(got[:, column], baseline[index])


def test_a_reset_slot_behaves_like_a_fresh_stream(
    model: DeepFilterModel, noisy: np.ndarray
) -> None:
    streams = _streams(noisy, 3, 100)
    filt = BatchedDeepFilter(model=model)
    options = {"atten_lim_db": 12.0, "post_filter_beta": 0.02}  # a reset keeps them
    fresh = _alone(filt, streams[1].reshape(-1), **options)
    slots = [filt.open_slot(**options), filt.open_slot()]
    for hop in range(50):  # both carry state from stream 0 and 2
        filt.process(slots, streams[[0, 2], hop])
    filt.reset_slot(slots[0])
    after = np.concatenate(
        [filt.process(slots, np.stack([streams[1, hop], streams[2, hop]]))[0] for hop in range(100)]
    )
    assert np.array_equal(after, fresh)
    # A slot closed and opened again is fresh as well.
    filt.close_slot(slots[0])
    assert np.array_equal(_alone(filt, streams[1].reshape(-1), **options), fresh)


def test_capacity_grows_to_its_bound_without_disturbing_streams(
    model: DeepFilterModel, noisy: np.ndarray
) -> None:
    streams = _streams(noisy, 2, 40)
    steady = BatchedDeepFilter(capacity=8, max_capacity=8, model=model)
    expected = _run_batch(steady, streams)
    filt = BatchedDeepFilter(capacity=MIN_BATCH, max_capacity=5, model=model)
    slots = [filt.open_slot() for _ in range(2)]
    got = [filt.process(slots, streams[:, hop]) for hop in range(20)]
    extra = [filt.open_slot() for _ in range(3)]  # the rows are reallocated: 2 -> 4 -> 5
    assert filt.capacity == 5
    got += [filt.process(slots, streams[:, hop]) for hop in range(20, 40)]
    assert np.array_equal(np.stack(got)[:, 0], expected[0])
    assert np.array_equal(np.stack(got)[:, 1], expected[1])
    with pytest.raises(SlotsExhausted):
        filt.open_slot()
    filt.close_slot(extra[0])
    assert filt.open_slot() == extra[0]  # the lowest free row is reused


def test_calls_that_break_the_contract_are_refused(model: DeepFilterModel) -> None:
    filt = BatchedDeepFilter(model=model)
    slot = filt.open_slot()
    hop = np.zeros((1, HOP), np.float32)
    with pytest.raises(ValueError):
        filt.process([slot], np.zeros((1, HOP - 1), np.float32))
    with pytest.raises(ValueError):
        filt.process([slot, slot], np.zeros((2, HOP), np.float32))
    with pytest.raises(KeyError):
        filt.process([slot + 1], hop)
    assert filt.process([], np.zeros((0, HOP), np.float32)).shape == (0, HOP)
    filt.close_slot(slot)
    with pytest.raises(KeyError):
        filt.reset_slot(slot)


def test_a_stream_costs_well_under_a_megabyte(model: DeepFilterModel) -> None:
    assert BatchedDeepFilter(model=model).bytes_per_stream < 1_000_000


# The graph edits


def _original_sessions() -> Sequence[ort.InferenceSession]:
    archive = read_archive()
    return [
        ort.InferenceSession(
            archive.graphs[name].SerializeToString(), providers=["CPUExecutionProvider"]
        )
        for name in ("enc.onnx", "erb_dec.onnx", "df_dec.onnx")
    ]


def test_stepping_the_edited_graphs_equals_the_exported_graphs_on_a_sequence(
    model: DeepFilterModel,
) -> None:
    """The export's zero paddings and zero GRU states, run on 30 frames at once, against the
    edited graphs stepped frame by frame with their state carried: the edits change nothing
    but where the memory lives."""
    frames = 30
    rng = np.random.default_rng(3)
    feat_erb = rng.standard_normal((1, 1, frames, 32)).astype(np.float32) * 0.5
    feat_spec = rng.standard_normal((1, 2, frames, 96)).astype(np.float32) * 0.5
    enc, erb_dec, df_dec = _original_sessions()
    encoded = dict(
        zip(
            [output.name for output in enc.get_outputs()],
            enc.run(None, {"feat_erb": feat_erb, "feat_spec": feat_spec}),
            strict=True,
        )
    )
    mask = erb_dec.run(["m"], {k: encoded[k] for k in ("emb", "e3", "e2", "e1", "e0")})[0]
    coefs = df_dec.run(["coefs"], {k: encoded[k] for k in ("emb", "c0")})[0]

    sessions = [GraphSession(graph) for graph in model.graphs]
    states = [
        [np.zeros((1, *spec.shape), np.float32) for spec in graph.states] for graph in model.graphs
    ]

    def step(index: int, **inputs: np.ndarray) -> list[np.ndarray]:
        graph = model.graphs[index]
        feeds = {**inputs, **{s.input: v for s, v in zip(graph.states, states[index], strict=True)}}
        outputs, states[index] = sessions[index].run(feeds)
        return outputs

    stepped_mask, stepped_coefs = [], []
    for t in range(frames):
        e0, e1, e2, e3, emb, c0 = step(
            0, feat_erb=feat_erb[:, :, t : t + 1], feat_spec=feat_spec[:, :, t : t + 1]
        )
        stepped_mask.append(step(1, emb=emb, e3=e3, e2=e2, e1=e1, e0=e0)[0])
        stepped_coefs.append(step(2, emb=emb, c0=c0)[0])
    np.testing.assert_allclose(np.concatenate(stepped_mask, axis=2), mask, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(stepped_coefs, axis=1), coefs, atol=1e-5)


# The DSP's constants and one detail the equivalence bar is too coarse for


def test_dsp_follows_libdf_in_its_details(model: DeepFilterModel) -> None:
    dsp = Dsp(DspConfig.from_ini(model.config))
    assert dsp.alpha == np.float32(0.99)  # calc_norm_alpha(48000, 480, 1)
    assert len(dsp.widths) == 32 and dsp.widths.sum() == 481 and dsp.widths.min() == 2
    # The Vorbis window at half overlap sums to one in power: the STFT reconstructs.
    window = dsp.window.astype(np.float64)
    np.testing.assert_allclose(window[:480] ** 2 + window[480:] ** 2, 1.0, atol=1e-6)
    # libDF's post filter walks the bins in fours: of 481, the last (Nyquist) is left alone.
    rng = np.random.default_rng(2)
    history = (rng.standard_normal((1, 5, 481)) + 1j * rng.standard_normal((1, 5, 481))).astype(
        np.complex64
    )
    gains = rng.uniform(0.05, 0.5, (1, 32)).astype(np.float32)
    coefs = (0.1 * rng.standard_normal((1, 96, 5)) * (1 + 1j)).astype(np.complex64)
    none = np.zeros(1, np.float32)
    plain = dsp.enhance(history, gains, coefs, none, none)
    filtered = dsp.enhance(history, gains, coefs, np.full(1, 0.05, np.float32), none)
    assert filtered[0, 480] == plain[0, 480]
    assert np.all(filtered[0, 96:480] != plain[0, 96:480])
