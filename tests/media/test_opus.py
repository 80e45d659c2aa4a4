"""The libopus binding: what comes out of the codec, what it makes up for a lost packet.

Opus output is delayed by the encoder's lookahead, so every comparison with the input
shifts the decoded signal by ``encoder.lookahead_samples``. Comparisons of concealment
quality are made against a clean decode of the same packets, which carries the same delay.
"""

from __future__ import annotations

import numpy as np
import pytest

from media.audio.opus import (
    MAX_FRAME_SAMPLES,
    Application,
    OpusDecoder,
    OpusEncoder,
    OpusError,
    _lib,
    packet_has_fec,
)

RATE = 48_000
FRAME = 960  # 20 ms


def voiced(seconds: float, seed: int = 0, pitch: float = 220.0) -> np.ndarray:
    """A speech-like signal: a harmonic voice with a gliding pitch and a syllable envelope.

    The pitch sits above the high-pass filter that the ``voip`` application puts on its
    input, so that filter does not stand in for a coding error.
    """
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    f0 = pitch + 30 * np.sin(2 * np.pi * 1.3 * t) + 15 * np.sin(2 * np.pi * 0.37 * t)
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = (0.5 * (1 + np.sin(2 * np.pi * 3 * t))) ** 1.5
    return (0.3 * voice * envelope + 0.003 * rng.standard_normal(n)).astype(np.float32)


def tone(seconds: float, frequency: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.4 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def frames(signal: np.ndarray) -> list[np.ndarray]:
    return [signal[i : i + FRAME] for i in range(0, len(signal) - FRAME + 1, FRAME)]


def encode_all(encoder: OpusEncoder, signal: np.ndarray) -> list[bytes]:
    return [encoder.encode(frame) for frame in frames(signal)]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


@pytest.mark.parametrize(
    ("application", "signal"),
    [
        (Application.VOIP, voiced(2.0)),
        (Application.AUDIO, voiced(2.0)),
        (Application.VOIP, tone(1.0)),
    ],
    ids=["voip-voice", "audio-voice", "voip-tone"],
)
def test_a_round_trip_at_96_kbps_keeps_the_signal(
    application: Application, signal: np.ndarray
) -> None:
    encoder = OpusEncoder(application=application, bitrate=96_000)
    decoder = OpusDecoder()
    decoded = np.concatenate([decoder.decode(p) for p in encode_all(encoder, signal)])
    assert decoded.dtype == np.float32
    assert len(decoded) == len(signal) // FRAME * FRAME

    delay = encoder.lookahead_samples
    assert delay > 0
    settle = 5 * FRAME  # the first frames are the codec starting up
    original = signal[settle : len(decoded) - delay]
    received = decoded[settle + delay :]
    assert correlation(original, received) > 0.9


def test_every_packet_decodes_to_one_20_ms_frame() -> None:
    encoder = OpusEncoder()
    decoder = OpusDecoder()
    for packet in encode_all(encoder, voiced(0.5)):
        assert len(decoder.decode(packet)) == FRAME


def test_a_stereo_stream_decodes_to_mono_frames() -> None:
    """Browsers send stereo Opus; the mono decoder downmixes it to one 960-sample frame."""
    left = tone(0.2, 440.0)
    stereo = np.stack([left, left], axis=1).reshape(-1)  # interleaved
    encoder = OpusEncoder(channels=2, bitrate=64_000)
    decoder = OpusDecoder()
    decoded = [
        decoder.decode(encoder.encode(stereo[i : i + 2 * FRAME]))
        for i in range(0, len(stereo), 2 * FRAME)
    ]
    assert all(len(frame) == FRAME for frame in decoded)
    assert rms(np.concatenate(decoded[3:])) > 0.5 * rms(left)


class TestConcealment:
    def primed_on_a_tone(self) -> tuple[OpusDecoder, np.ndarray, int]:
        signal = tone(1.0)
        encoder = OpusEncoder(bitrate=96_000)
        decoder = OpusDecoder()
        received = 25
        for packet in encode_all(encoder, signal[: received * FRAME]):
            decoder.decode(packet)
        return decoder, signal, received * FRAME - encoder.lookahead_samples

    def test_a_concealed_frame_continues_the_tone_rather_than_going_silent(self) -> None:
        decoder, signal, position = self.primed_on_a_tone()
        concealed = decoder.conceal(FRAME)
        assert len(concealed) == FRAME
        assert concealed.dtype == np.float32
        truth = signal[position : position + FRAME]
        assert rms(concealed) > 0.5 * rms(truth)
        assert correlation(concealed, truth) > 0.8

    def test_a_long_concealment_fades_out(self) -> None:
        decoder, _, _ = self.primed_on_a_tone()
        concealed = [decoder.conceal(FRAME) for _ in range(12)]
        assert rms(np.concatenate(concealed[-3:])) < 0.3 * rms(concealed[0])

    def test_concealment_comes_in_2_5_ms_units(self) -> None:
        decoder, _, _ = self.primed_on_a_tone()
        assert len(decoder.conceal(240)) == 240
        with pytest.raises(OpusError):
            decoder.conceal(1000)

    def test_a_concealment_longer_than_the_decode_buffer_is_refused(self) -> None:
        """libopus writes as many samples as asked for: more than the 120 ms buffer used
        to overrun it and crash the process; now the call raises instead."""
        decoder, _, _ = self.primed_on_a_tone()
        assert len(decoder.conceal(MAX_FRAME_SAMPLES)) == MAX_FRAME_SAMPLES
        with pytest.raises(OpusError, match="at most"):
            decoder.conceal(2 * MAX_FRAME_SAMPLES)
        with pytest.raises(OpusError, match="at most"):
            decoder.recover(b"\x00", 2 * MAX_FRAME_SAMPLES)


@pytest.fixture(scope="module")
def packets() -> list[bytes]:
    """Four seconds of voice at a SILK bitrate, with FEC for an expected 20 % loss."""
    encoder = OpusEncoder(
        application=Application.VOIP, bitrate=24_000, fec=True, expected_loss_percent=20
    )
    return encode_all(encoder, voiced(4.0, seed=1))


class TestForwardErrorCorrection:
    def test_packets_carry_fec_at_a_silk_bitrate(self, packets: list[bytes]) -> None:
        carrying = sum(packet_has_fec(p) for p in packets)
        assert carrying > len(packets) // 2

    def test_packets_carry_no_fec_when_it_is_off(self) -> None:
        encoder = OpusEncoder(application=Application.VOIP, bitrate=24_000, fec=False)
        assert not any(packet_has_fec(p) for p in encode_all(encoder, voiced(1.0)))
        assert not packet_has_fec(b"")

    @pytest.mark.parametrize(("bitrate", "fec"), [(24_000, True), (96_000, True), (96_000, False)])
    def test_the_first_byte_shortcut_agrees_with_libopus(self, bitrate: int, fec: bool) -> None:
        """CELT-only packets (96 kb/s without FEC) are answered from their TOC byte; SILK and
        hybrid ones by libopus; either way libopus itself says the same."""
        encoder = OpusEncoder(
            application=Application.VOIP, bitrate=bitrate, fec=fec, expected_loss_percent=20
        )
        lib = _lib()
        packets = encode_all(encoder, voiced(1.0, seed=2))
        for packet in packets:
            assert packet_has_fec(packet) == (lib.opus_packet_has_lbrr(packet, len(packet)) == 1)
        if not fec:
            assert all(packet[0] >> 3 >= 16 for packet in packets)  # CELT only

    def test_fec_rebuilds_a_lost_frame_closer_than_concealment(self, packets: list[bytes]) -> None:
        """Each lost frame is compared with a clean decode of it; FEC must win by far."""
        clean_decoder = OpusDecoder()
        clean = [clean_decoder.decode(p) for p in packets]
        lost = [k for k in range(10, len(packets) - 1, 7) if packet_has_fec(packets[k + 1])]
        assert len(lost) >= 10
        fec_errors, plc_errors = [], []
        for k in lost:
            with_fec, with_plc = OpusDecoder(), OpusDecoder()
            for packet in packets[:k]:
                with_fec.decode(packet)
                with_plc.decode(packet)
            rebuilt = with_fec.recover(packets[k + 1], FRAME)
            concealed = with_plc.conceal(FRAME)
            assert len(rebuilt) == FRAME
            fec_errors.append(float(np.sum((rebuilt - clean[k]) ** 2)))
            plc_errors.append(float(np.sum((concealed - clean[k]) ** 2)))
            # The packet after the gap still decodes normally.
            assert len(with_fec.decode(packets[k + 1])) == FRAME
        assert sum(fec_errors) < 0.25 * sum(plc_errors)
        wins = sum(f < p for f, p in zip(fec_errors, plc_errors, strict=True))
        assert wins >= 0.8 * len(lost)


def test_restricted_lowdelay_has_a_shorter_lookahead_than_voip() -> None:
    voip = OpusEncoder(application=Application.VOIP)
    lowdelay = OpusEncoder(application=Application.RESTRICTED_LOWDELAY)
    assert 0 < lowdelay.lookahead_samples < voip.lookahead_samples


def test_a_higher_bitrate_makes_bigger_packets() -> None:
    signal = voiced(1.0)
    sizes = [
        np.mean([len(p) for p in encode_all(OpusEncoder(bitrate=bitrate), signal)])
        for bitrate in (16_000, 32_000, 64_000)
    ]
    assert sizes[0] < sizes[1] < sizes[2]
    # 64 kb/s is 160 bytes per 20 ms packet; VBR wanders around it, not far.
    assert 80 < sizes[2] < 240


def test_a_frame_of_the_wrong_length_raises() -> None:
    with pytest.raises(OpusError):
        OpusEncoder().encode(np.zeros(1000, dtype=np.float32))


def test_a_frame_longer_than_any_opus_frame_raises_and_the_next_encodes() -> None:
    encoder = OpusEncoder()
    with pytest.raises(OpusError, match="at most"):
        encoder.encode(np.zeros(MAX_FRAME_SAMPLES + 1, dtype=np.float32))
    assert encoder.encode(np.zeros(960, dtype=np.float32))


def test_a_float64_frame_encodes_as_its_float32_copy() -> None:
    frame = (0.3 * np.sin(np.arange(960) * 0.05)).astype(np.float64)
    as_float64, as_float32 = OpusEncoder(), OpusEncoder()
    assert as_float64.encode(frame) == as_float32.encode(frame.astype(np.float32))


def test_an_invalid_channel_count_raises() -> None:
    with pytest.raises(OpusError):
        OpusDecoder(channels=3)
    with pytest.raises(OpusError):
        OpusEncoder(channels=3)


class TestClosed:
    def test_a_closed_encoder_raises_rather_than_crashing(self) -> None:
        """``set_complexity`` on a closed encoder used to hand libopus a NULL state."""
        encoder = OpusEncoder()
        encoder.close()
        encoder.close()  # twice is harmless
        with pytest.raises(OpusError, match="closed"):
            encoder.encode(np.zeros(FRAME, dtype=np.float32))
        with pytest.raises(OpusError, match="closed"):
            encoder.set_complexity(5)

    def test_a_closed_decoder_raises_rather_than_crashing(self) -> None:
        packet = OpusEncoder().encode(np.zeros(FRAME, dtype=np.float32))
        decoder = OpusDecoder()
        decoder.close()
        decoder.close()
        with pytest.raises(OpusError, match="closed"):
            decoder.decode(packet)
        with pytest.raises(OpusError, match="closed"):
            decoder.conceal(FRAME)
        with pytest.raises(OpusError, match="closed"):
            decoder.recover(packet, FRAME)
