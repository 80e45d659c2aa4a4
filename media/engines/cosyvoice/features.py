"""The three audio features CosyVoice2's front end needs, computed with numpy and torch.

Upstream computes them with openai-whisper (log-mel for the speech tokenizer), torchaudio's
Kaldi compatibility module (filter banks for the CAM++ speaker embedding) and Matcha-TTS's
librosa-based mel (the flow's prompt features). None of those is installed here, so each is
re-derived from its published definition:

- ``whisper_log_mel``: 16 kHz, 400-point Hann STFT every 160 samples (centred, reflect
  padded), the last frame dropped, 128 Slaney mel bands, log10 clamped to 8 decades below the
  peak, then scaled as ``(x + 4) / 4``.
- ``kaldi_fbank``: 25 ms Povey-windowed frames every 10 ms (no edge padding), DC removed,
  0.97 pre-emphasis, 512-point power spectrum, 80 Kaldi mel bands from 20 Hz to Nyquist,
  natural log floored at float epsilon.
- ``prompt_mel``: 24 kHz, 1920-point Hann STFT every 480 samples after reflect padding of
  720 on each side, magnitude, 80 Slaney mel bands up to 8 kHz, natural log clamped at 1e-5:
  one frame per 480 samples, two per speech token.

Checked once against the originals on random signals: the Slaney filters equal librosa 0.11's
(to 4e-9), the two mels equal Whisper's and Matcha's recipes run with librosa's filters (to
6e-8 and 5e-7), and the filter banks equal torchaudio 2.11's ``compliance.kaldi.fbank`` (to
2e-4 on log energies of ~11, float32 rounding).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

WHISPER_RATE = 16_000
WHISPER_FFT = 400
WHISPER_HOP = 160
WHISPER_MELS = 128
WHISPER_DYNAMIC_RANGE = 8.0

FBANK_RATE = 16_000
FBANK_FRAME = 400
FBANK_SHIFT = 160
FBANK_FFT = 512
FBANK_MELS = 80
FBANK_LOW_HZ = 20.0
PREEMPHASIS = 0.97
POVEY_POWER = 0.85

PROMPT_RATE = 24_000
PROMPT_FFT = 1920
PROMPT_HOP = 480
PROMPT_MELS = 80
PROMPT_FMAX = 8000.0
PROMPT_LOG_FLOOR = 1e-5
MAGNITUDE_EPSILON = 1e-9

# Slaney's mel scale: linear below 1 kHz, logarithmic above.
_SLANEY_LINEAR_STEP = 200.0 / 3
_SLANEY_BREAK_HZ = 1000.0
_SLANEY_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_slaney(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _SLANEY_LINEAR_STEP
    above = hz >= _SLANEY_BREAK_HZ
    break_mel = _SLANEY_BREAK_HZ / _SLANEY_LINEAR_STEP
    mel[above] = break_mel + np.log(hz[above] / _SLANEY_BREAK_HZ) / _SLANEY_LOG_STEP
    return mel


def _slaney_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * _SLANEY_LINEAR_STEP
    break_mel = _SLANEY_BREAK_HZ / _SLANEY_LINEAR_STEP
    above = mel >= break_mel
    hz[above] = _SLANEY_BREAK_HZ * np.exp(_SLANEY_LOG_STEP * (mel[above] - break_mel))
    return hz


@lru_cache(maxsize=4)
def slaney_mel_filters(rate: int, n_fft: int, n_mels: int, fmax: float) -> torch.Tensor:
    """Triangular filters with Slaney area normalisation, shape (n_mels, n_fft // 2 + 1)."""
    fft_hz = np.linspace(0.0, rate / 2, n_fft // 2 + 1)
    edges = _slaney_to_hz(np.linspace(0.0, _hz_to_slaney(np.array([fmax]))[0], n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return torch.from_numpy(filters.astype(np.float32))


def whisper_log_mel(audio_16k: np.ndarray) -> np.ndarray:
    """Whisper's 128-band log-mel, shape (128, frames) at 100 frames per second."""
    samples = torch.from_numpy(np.ascontiguousarray(audio_16k, dtype=np.float32))
    window = torch.hann_window(WHISPER_FFT)
    spectrum = torch.stft(samples, WHISPER_FFT, WHISPER_HOP, window=window, return_complex=True)
    power = spectrum[..., :-1].abs() ** 2
    filters = slaney_mel_filters(WHISPER_RATE, WHISPER_FFT, WHISPER_MELS, WHISPER_RATE / 2)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - WHISPER_DYNAMIC_RANGE)
    return ((log_spec + 4.0) / 4.0).numpy()


@lru_cache(maxsize=1)
def _kaldi_mel_banks() -> torch.Tensor:
    """Kaldi's mel filters on its 1127 * ln(1 + f / 700) scale, shape (80, 257)."""

    def mel(hz: np.ndarray) -> np.ndarray:
        return 1127.0 * np.log(1.0 + hz / 700.0)

    bins = FBANK_FFT // 2
    low, high = mel(np.array(FBANK_LOW_HZ)), mel(np.array(FBANK_RATE / 2))
    delta = (high - low) / (FBANK_MELS + 1)
    left = low + np.arange(FBANK_MELS)[:, None] * delta
    centre, right = left + delta, left + 2 * delta
    fft_mel = mel(np.arange(bins) * FBANK_RATE / FBANK_FFT)[None, :]
    up = (fft_mel - left) / (centre - left)
    down = (right - fft_mel) / (right - centre)
    banks = np.maximum(0.0, np.minimum(up, down))
    banks = np.pad(banks, ((0, 0), (0, 1)))  # the Nyquist bin gets no weight, as in Kaldi
    return torch.from_numpy(banks.astype(np.float32))


def kaldi_fbank(audio_16k: np.ndarray) -> np.ndarray:
    """Kaldi-compatible 80-band log filter bank, shape (frames, 80) at 100 frames per second."""
    samples = torch.from_numpy(np.ascontiguousarray(audio_16k, dtype=np.float32))
    if samples.numel() < FBANK_FRAME:
        return np.zeros((0, FBANK_MELS), np.float32)
    frames = samples.unfold(0, FBANK_FRAME, FBANK_SHIFT).clone()
    frames -= frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - PREEMPHASIS * previous
    window = torch.hann_window(FBANK_FRAME, periodic=False).pow(POVEY_POWER)
    spectrum = torch.fft.rfft(frames * window, n=FBANK_FFT)
    power = spectrum.abs() ** 2
    energies = power @ _kaldi_mel_banks().T
    return torch.clamp(energies, min=torch.finfo(torch.float32).eps).log().numpy()


def prompt_mel(audio_24k: np.ndarray) -> np.ndarray:
    """Matcha-TTS's 80-band log-mel used as the flow's prompt, shape (frames, 80)."""
    samples = torch.from_numpy(np.ascontiguousarray(audio_24k, dtype=np.float32))
    pad = (PROMPT_FFT - PROMPT_HOP) // 2
    padded = torch.nn.functional.pad(samples[None, None], (pad, pad), mode="reflect")[0, 0]
    window = torch.hann_window(PROMPT_FFT)
    spectrum = torch.stft(
        padded, PROMPT_FFT, PROMPT_HOP, window=window, center=False, return_complex=True
    )
    magnitude = torch.sqrt(spectrum.real**2 + spectrum.imag**2 + MAGNITUDE_EPSILON)
    filters = slaney_mel_filters(PROMPT_RATE, PROMPT_FFT, PROMPT_MELS, PROMPT_FMAX)
    return torch.clamp(filters @ magnitude, min=PROMPT_LOG_FLOOR).log().T.contiguous().numpy()
