"""Round-trip measurement on synthetic streams whose delay and timing are known exactly."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from peer.probe import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    ChirpInserter,
    Timeline,
    align,
    detect_markers,
    make_chirp,
    marker_rtts,
    rtt_from_envelopes,
    rtt_from_markers,
    summarize,
)

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
T0 = 1000.0  # an arbitrary monotonic clock origin
OPUS_DELAY = 312  # libopus encoder lookahead plus decoder delay at 48 kHz (6.5 ms)


def speech_like(seconds: float, seed: int = 7, level: float = 0.4) -> np.ndarray:
    return _speech_like(seconds, seed, level).copy()


@functools.cache
def _speech_like(seconds: float, seed: int, level: float) -> np.ndarray:
    """Voiced "syllables" of random length and pitch separated by random pauses.

    Harmonics of a gliding fundamental under a smooth attack/decay envelope: loud, low
    and harmonic like speech, with the on/off rhythm the envelope method relies on.
    """
    rng = np.random.default_rng(seed)
    out = np.zeros(round(seconds * SAMPLE_RATE))
    pos = round(rng.uniform(0.05, 0.3) * SAMPLE_RATE)
    while pos < len(out):
        n = round(rng.uniform(0.08, 0.35) * SAMPLE_RATE)
        t = np.arange(n) / SAMPLE_RATE
        f0 = rng.uniform(100, 220) * (1 + rng.uniform(-0.15, 0.15) * t / t[-1])
        phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
        voice = sum(
            np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k
            for k in range(1, 20)
            if k * f0.max() < 4000
        )
        attack = np.minimum(1.0, t / rng.uniform(0.01, 0.04))
        decay = np.minimum(1.0, (t[-1] - t) / rng.uniform(0.02, 0.08))
        syllable = voice * attack * decay * rng.uniform(0.3, 1.0)
        end = min(pos + n, len(out))
        out[pos:end] += syllable[: end - pos]
        pos = end + round(rng.uniform(0.05, 0.4) * SAMPLE_RATE)
    return (level * out / np.max(np.abs(out))).astype(np.float32)


def delayed(x: np.ndarray, seconds: float, total: int) -> np.ndarray:
    """``x`` delayed by a possibly fractional number of samples, cut or padded to ``total``."""
    size = 1 << (max(total, len(x)) + round(abs(seconds) * SAMPLE_RATE) + 1).bit_length()
    freqs = np.fft.rfftfreq(size, 1 / SAMPLE_RATE)
    shifted = np.fft.irfft(np.fft.rfft(x, size) * np.exp(-2j * np.pi * freqs * seconds), size)
    return shifted[:total].astype(np.float32)


def crude_denoiser(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Keeps the speech and not the waveform: noise, a spectral gate, a low-pass at 3 kHz
    and random phases, so only the loudness contour survives (as with a neural model)."""
    noisy = x + 0.02 * rng.standard_normal(len(x))
    n_fft, hop = 512, 256
    window = np.sqrt(np.hanning(n_fft + 1)[:n_fft])
    padded = np.concatenate((np.zeros(n_fft), noisy, np.zeros(n_fft)))
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop] * window
    spectra = np.fft.rfft(frames, axis=1)
    magnitude = np.abs(spectra)
    gate = magnitude > 3 * np.median(magnitude, axis=0)  # per-bin noise estimate
    spectra = spectra * gate * (np.fft.rfftfreq(n_fft, 1 / SAMPLE_RATE) < 3000)
    spectra = spectra * np.exp(1j * rng.uniform(-np.pi, np.pi, spectra.shape))
    cleaned = np.fft.irfft(spectra, n_fft, axis=1) * window
    out = np.zeros(len(padded))
    for i, frame in enumerate(cleaned):
        out[i * hop : i * hop + n_fft] += frame
    return out[n_fft : n_fft + len(x)].astype(np.float32)


def frames_of(x: np.ndarray) -> list[np.ndarray]:
    return [x[i : i + FRAME_SAMPLES] for i in range(0, len(x), FRAME_SAMPLES)]


def send(program: np.ndarray, inserter: ChirpInserter, times: list[float]):
    """Run the program through the inserter frame by frame, stamping each frame."""
    timeline = Timeline()
    out = []
    for frame, at in zip(frames_of(program), times, strict=False):
        out.append(inserter.process(frame))
        timeline.append(len(frame), at)
    return np.concatenate(out), timeline


def receive(audio: np.ndarray, times: list[float]) -> Timeline:
    timeline = Timeline()
    for frame, at in zip(frames_of(audio), times, strict=True):
        timeline.append(len(frame), at)
    return timeline


def paced(n_frames: int, start: float = T0) -> list[float]:
    return [start + i * FRAME_S for i in range(n_frames)]


# --- Timeline ---------------------------------------------------------------------------


def test_timeline_stamps_each_frame_and_extrapolates_outside():
    tl = Timeline()
    tl.append(960, 10.0)
    tl.append(960, 10.05)  # late frame
    tl.append(480, 10.05)  # burst: arrived together with the previous one
    assert len(tl) == 2400
    assert tl.time_of(0) == pytest.approx(10.0)
    assert tl.time_of(480) == pytest.approx(10.01)
    assert tl.time_of(960) == pytest.approx(10.05)
    assert tl.time_of(1920.5) == pytest.approx(10.05 + 0.5 / SAMPLE_RATE)
    assert tl.time_of(2400 + 48) == pytest.approx(10.05 + 0.011)
    assert tl.time_of(-48) == pytest.approx(10.0 - 0.001)
    assert tl.index_at(10.01) == pytest.approx(480)
    assert tl.index_at(10.03) == pytest.approx(960)  # inside the gap: end of frame 0
    with pytest.raises(ValueError):
        Timeline().time_of(0)


# --- Markers ----------------------------------------------------------------------------


def test_chirp_is_short_bounded_and_in_band():
    chirp = make_chirp()
    assert len(chirp) == 240
    assert np.max(np.abs(chirp)) <= 0.25 + 1e-6
    spectrum = np.abs(np.fft.rfft(chirp, 4096)) ** 2
    freqs = np.fft.rfftfreq(4096, 1 / SAMPLE_RATE)
    in_band = spectrum[(freqs > 1500) & (freqs < 8500)].sum()
    assert in_band / spectrum.sum() > 0.95


def test_inserter_places_markers_across_frame_boundaries():
    inserter = ChirpInserter(interval_s=0.25, first_at_s=0.0195)  # first one straddles
    out = np.concatenate([inserter.process(np.zeros(FRAME_SAMPLES)) for _ in range(50)])
    assert inserter.marker_starts == [936, 936 + 12000, 936 + 24000, 936 + 36000]
    expected = np.zeros_like(out)
    for start in inserter.marker_starts:
        expected[start : start + 240] = inserter.template
    np.testing.assert_allclose(out, expected, atol=1e-7)
    assert inserter.samples_processed == 50 * FRAME_SAMPLES


def test_inserter_ducks_loud_audio_and_never_clips():
    inserter = ChirpInserter(interval_s=0.1, first_at_s=0.0)
    out = inserter.process(np.full(4800, 0.95, dtype=np.float32))
    assert np.max(np.abs(out)) <= 1.0
    assert np.max(np.abs(out[60:180])) < 0.25 + 0.1  # program ducked to 0.1 under the marker
    assert out.dtype == np.float32


@pytest.mark.parametrize("delay_s", [0.0373, 0.1187, 0.4])
def test_markers_through_delay_gain_and_noise(delay_s: float):
    rng = np.random.default_rng(1)
    program = speech_like(10.0)
    inserter = ChirpInserter()
    sent, sent_tl = send(program, inserter, paced(500))
    received = 0.6 * delayed(sent, delay_s, len(sent))
    received += 0.005 * rng.standard_normal(len(received)).astype(np.float32)
    received_tl = receive(received, paced(500))  # recording starts with sending

    found = detect_markers(received, inserter.template)
    arrived = [start + delay_s * SAMPLE_RATE for start in inserter.marker_starts]
    expected = [round(a) for a in arrived if a + 240 <= len(received)]
    assert found == expected  # every marker, nothing in the speech

    rtts = marker_rtts(inserter, sent_tl, received, received_tl)
    assert len(rtts) == len(expected)
    assert max(abs(r - delay_s) for r in rtts) < 0.001
    assert summarize(rtts)["rtt_ms_p50"] == pytest.approx(delay_s * 1000, abs=0.05)


def test_markers_honour_jittered_timelines():
    """Same samples both ways, so each marker's RTT is the network delay of its frame."""
    rng = np.random.default_rng(2)
    n_frames = 400
    send_times = [T0 + i * FRAME_S + rng.uniform(0, 0.004) for i in range(n_frames)]
    network = 0.060 + rng.uniform(0, 0.030, n_frames)
    inserter = ChirpInserter(interval_s=0.33)
    sent, sent_tl = send(speech_like(n_frames * FRAME_S, seed=3), inserter, send_times)
    received = sent + 0.003 * rng.standard_normal(len(sent)).astype(np.float32)
    received_tl = receive(received, list(np.add(send_times, network)))

    rtts = marker_rtts(inserter, sent_tl, received, received_tl)
    truth = [network[start // FRAME_SAMPLES] for start in inserter.marker_starts]
    assert len(rtts) == len(truth)
    np.testing.assert_allclose(rtts, truth, atol=0.001)
    assert np.std(truth) > 0.005  # the jitter really varied


def test_markers_when_recording_starts_late():
    """The first received frame holds sound sent 250 ms earlier: lag 0 in samples."""
    inserter = ChirpInserter()
    sent, sent_tl = send(speech_like(6.0, seed=4), inserter, paced(300))
    received_tl = receive(sent, paced(300, start=T0 + 0.25))
    rtts = marker_rtts(inserter, sent_tl, sent, received_tl)
    assert len(rtts) == 11
    np.testing.assert_allclose(rtts, 0.25, atol=1e-6)


def test_no_markers_found_in_speech_or_noise():
    rng = np.random.default_rng(5)
    template = make_chirp()
    assert detect_markers(speech_like(12.0, seed=6), template) == []
    assert detect_markers(0.3 * rng.standard_normal(10 * SAMPLE_RATE), template) == []
    assert detect_markers(np.zeros(SAMPLE_RATE), template) == []
    assert detect_markers(np.zeros(100), template) == []


def test_marker_pairing_drops_lost_duplicate_and_out_of_window_markers():
    sent = [1.0, 1.5, 2.0, 2.5, 3.0]
    received = [1.04, 1.0401, 2.05, 2.541, 3.9]  # 1.5 lost, 1.0 twice, 3.0 too late
    rtts = rtt_from_markers(sent, received, max_rtt_s=0.5)
    np.testing.assert_allclose(rtts, [0.04, 0.05, 0.041])
    assert rtt_from_markers([], [1.0]) == []
    assert rtt_from_markers([1.0], [0.9]) == []


def test_markers_survive_opus_at_96_kbps():
    av = pytest.importorskip("av")
    inserter = ChirpInserter()
    program = speech_like(5.0, seed=8, level=0.7)
    sent = np.concatenate([inserter.process(frame) for frame in frames_of(program)])

    encoder = av.CodecContext.create("libopus", "w")
    encoder.bit_rate = 96_000
    encoder.sample_rate = SAMPLE_RATE
    encoder.format = "s16"
    encoder.layout = "stereo"
    encoder.options = {"application": "voip"}
    decoder = av.CodecContext.create("libopus", "r")
    pcm = (np.clip(sent, -1, 1) * 32767).astype(np.int16)
    decoded = []
    for i, frame in enumerate(frames_of(pcm)):
        audio = av.AudioFrame.from_ndarray(
            np.repeat(frame, 2)[None, :], format="s16", layout="stereo"
        )
        audio.sample_rate = SAMPLE_RATE
        audio.pts = i * FRAME_SAMPLES
        for packet in encoder.encode(audio):
            for out in decoder.decode(packet):
                samples = out.to_ndarray()
                left = samples[0] if out.format.is_planar else samples.reshape(-1, 2)[:, 0]
                scale = 32768.0 if np.issubdtype(left.dtype, np.integer) else 1.0
                decoded.append(left.astype(np.float32) / scale)
    received = np.concatenate(decoded)

    # aiortc's "voip" mode high-passes the input, which shifts the phase of this low,
    # fundamental-heavy voice: the waveform correlation is about 0.90 here (0.9995 in
    # "audio" mode), while the 2-8 kHz markers still score above 0.9.
    lag, corr = align(sent, received, max_lag=2000)
    assert abs(lag - OPUS_DELAY) <= 1
    assert corr >= 0.85
    found = detect_markers(received, inserter.template)
    sent_in_full = [s for s in inserter.marker_starts if s + OPUS_DELAY + 240 <= len(received)]
    assert len(found) == len(sent_in_full) >= 8
    assert [f - s for f, s in zip(found, sent_in_full, strict=True)] == [OPUS_DELAY] * len(found)


# --- Envelopes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay_s", "late_start_s"), [(0.0873, 0.0), (0.2311, 0.0), (0.0873, 0.35)]
)
def test_envelopes_recover_delay_through_a_waveform_changing_engine(
    delay_s: float, late_start_s: float
):
    rng = np.random.default_rng(9)
    n_frames = 450  # 9 s
    sent = speech_like(n_frames * FRAME_S, seed=10) + 0.01 * rng.standard_normal(
        n_frames * FRAME_SAMPLES
    ).astype(np.float32)
    sent_tl = receive(sent, paced(n_frames))
    processed = 0.8 * delayed(crude_denoiser(sent, rng), delay_s, len(sent))
    # A late recording misses its first frames; they never appear in its sample numbering.
    skip = round(late_start_s / FRAME_S)
    received = processed[skip * FRAME_SAMPLES :]
    received_tl = receive(received, paced(n_frames - skip, start=T0 + skip * FRAME_S))

    assert align(sent, received, 20_000)[1] < 0.2  # nothing of the waveform is left
    rtts = rtt_from_envelopes(sent, sent_tl, received, received_tl)
    assert len(rtts) >= 5
    assert max(abs(r - delay_s) for r in rtts) < 0.005


def test_envelopes_honour_jittered_arrival():
    rng = np.random.default_rng(11)
    n_frames = 500
    sent = speech_like(n_frames * FRAME_S, seed=12)
    sent_tl = receive(sent, paced(n_frames))
    # Sample stream delayed by 40 ms, and every frame reaches the peer 50-54 ms after it
    # was due: the RTT of a window is 90 ms plus its own frames' lateness.
    lateness = 0.050 + rng.uniform(0, 0.004, n_frames)
    received = crude_denoiser(delayed(sent, 0.040, len(sent)), rng)
    received_tl = receive(received, list(np.add(paced(n_frames), lateness)))
    rtts = rtt_from_envelopes(sent, sent_tl, received, received_tl)
    assert len(rtts) >= 5
    assert max(abs(r - 0.092) for r in rtts) < 0.005


def test_envelopes_skip_silence_and_steady_noise():
    rng = np.random.default_rng(13)
    n = 5 * SAMPLE_RATE
    noise = (0.05 * rng.standard_normal(n)).astype(np.float32)
    for received in (np.zeros(n, dtype=np.float32), noise):
        tl = receive(received, paced(n // FRAME_SAMPLES))
        assert rtt_from_envelopes(noise, tl, received, tl) == []
    empty = Timeline()
    assert rtt_from_envelopes(np.zeros(0), empty, np.zeros(0), empty) == []


# --- align and summarize ----------------------------------------------------------------


@pytest.mark.parametrize("lag", [0, 1234, -321])
def test_align_recovers_lag_and_identity_correlation(lag: int):
    rng = np.random.default_rng(14)
    sent = speech_like(3.0, seed=15) + 0.01 * rng.standard_normal(3 * SAMPLE_RATE)
    received = 0.5 * (np.concatenate((np.zeros(lag), sent)) if lag >= 0 else sent[-lag:])
    found, corr = align(sent, received, max_lag=2000)
    assert found == lag
    assert corr == pytest.approx(1.0, abs=1e-6)


def test_align_rejects_unrelated_noise_and_bounds_correlation():
    rng = np.random.default_rng(16)
    a, b = rng.standard_normal(48_000), rng.standard_normal(48_000)
    assert align(a, b, max_lag=4800)[1] < 0.5
    _, inverted = align(a, -a, max_lag=0)
    assert inverted == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        align(np.zeros(0), a, 10)


def test_summarize():
    assert summarize([]) == {"rtt_ms_p50": None, "rtt_ms_p95": None, "rtt_samples": 0}
    summary = summarize([0.040, 0.041, 0.042, 0.043, 0.100])
    assert summary["rtt_samples"] == 5
    assert summary["rtt_ms_p50"] == pytest.approx(42.0)
    assert summary["rtt_ms_p95"] == pytest.approx(88.6)
