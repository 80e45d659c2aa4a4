"""libDF's signal processing around the DeepFilterNet3 graphs, vectorised over a batch of streams.

Every function takes arrays whose first axis is the stream (any number of rows) and computes
each row on its own, in float32 like libDF: no BLAS call and no reduction across rows, so a
row's result never depends on which other rows share the batch. What each step matches, with
the place in libDF (``libDF/src/lib.rs`` for ``DFState``, ``libDF/src/tract.rs`` for the
streaming runtime ``DfTract`` the C API drives):

- windows and STFT: ``DFState::new`` builds the Vorbis window ``sin(pi/2 sin^2(pi (n + 0.5) /
  (N/2)))`` over ``fft_size`` = 960 samples in float64 and stores it as float32;
  ``frame_analysis`` windows the previous hop and the new one, runs an unnormalised real FFT
  and scales by ``wnorm = 1 / (N^2 / (2 hop))`` = 1/960 (numpy's ``norm="forward"``);
  ``frame_synthesis`` runs the unnormalised inverse (``norm="forward"`` again: no 1/N),
  windows it and overlap-adds with the kept second half.
- ERB features (``DFState::feat_erb``): band power as the mean of ``re^2 + im^2`` over each
  band (``compute_band_corr``; bands from ``erb_fb``), ``10 log10(p + 1e-10)``, then
  ``band_mean_norm_erb``: ``s = x (1 - a) + s a``, ``(x - s) / 40``, ``s`` starting at
  ``linspace(-60, -90)`` (``MEAN_NORM_INIT``).
- complex features (``DFState::feat_cplx``, ``band_unit_norm``) of the first ``nb_df`` bins:
  ``s = |x| (1 - a) + s a``, ``x / sqrt(s)``, ``s`` starting at ``linspace(0.001, 0.0001)``
  (``UNIT_NORM_INIT``); ``a`` = ``calc_norm_alpha(sr, hop, norm_tau)``: ``exp(-hop / sr /
  tau)`` rounded to the first decimals that keep it below 1 (0.99).
- look-ahead (``DfTract::process``): the model's answer at hop ``t`` is for frame ``t - 2``.
  libDF keeps the last ``max(df_order, lookahead)`` = 5 noisy spectra; the ERB gains apply
  to frame ``t - conv_lookahead`` (``rolling_spec_buf_y[df_order - 1]``, the same noisy
  frame: that buffer only ever holds noisy frames when they are read), the deep filter
  replaces its first ``nb_df`` bins (``df``: output zeroed, then ``sum_k X[t - 4 + k] c_k``
  over the 5 taps, oldest first), and the post filter and the attenuation limit compare it
  with the noisy frame ``t - lookahead`` (``rolling_spec_buf_x[max(df_order, la) - la - 1]``).
  With the windows' one hop of overlap that is libDF's 30 ms delay.
- ERB gains (``apply_interp_band_gain``): each band's gain multiplies all its bins; the
  deep filter then overwrites the first 96.
- post filter (``post_filter``, only with beta > 0): ``g = clamp(|e| / (|n| + 1e-12), 1e-12,
  1)``, ``e *= (1 + beta) / (1 + beta (g / (g sin(g pi / 2)))^2)``; libDF walks the bins in
  chunks of four, so the last (Nyquist) bin of 481 is never touched.
- attenuation limit (``DfTract::process``): ``e (1 - lim) + lim n`` with ``lim =
  10^(-dB / 20)``, none from 100 dB on (``set_atten_lim``).

libDF's three shortcuts never fire in the C engine's configuration, so they are not here: the
stage thresholds (-15, 35, 35 dB in ``capi.rs``) coincide with the clamp of the model's local
SNR estimate, so gains and the deep filter always apply; its silence counter is reset by every
frame that applies gains, so it never reaches the 5 that would zero the output; and an
attenuation limit under 0.01 dB, which would return the input undelayed, is raised to 0.05 dB
by the C engine (``ATTEN_LIM_FLOOR_DB``), as ``BatchedDeepFilter.open_slot`` does.
"""

from __future__ import annotations

import configparser
import math
from dataclasses import dataclass

import numpy as np

MEAN_NORM_INIT = (-60.0, -90.0)  # lib.rs, dB
UNIT_NORM_INIT = (0.001, 0.0001)  # lib.rs
ERB_DB_EPS = 1e-10  # feat_erb: log10(p + 1e-10)
ERB_NORM_DIVISOR = 40.0  # band_mean_norm_erb
POST_FILTER_EPS = 1e-12  # lib.rs post_filter
POST_FILTER_CHUNK = 4  # post_filter walks chunks_exact(4): a remainder bin is left alone
NO_LIMIT_DB = 100.0  # set_atten_lim: at and above this, no limit


@dataclass(frozen=True)
class DspConfig:
    """The ``[df]`` and ``[deepfilternet]`` values of the model's config.ini that the DSP uses."""

    sample_rate: int
    fft_size: int
    hop_size: int
    nb_erb: int
    nb_df: int
    min_nb_erb_freqs: int
    norm_tau: float
    df_order: int
    df_lookahead: int
    conv_lookahead: int

    @classmethod
    def from_ini(cls, config: configparser.ConfigParser) -> DspConfig:
        def number(key: str) -> int:
            # libDF reads df_order and df_lookahead from [df], else from [deepfilternet].
            section = "df" if config.has_option("df", key) else "deepfilternet"
            return config.getint(section, key)

        parsed = cls(
            sample_rate=number("sr"),
            fft_size=number("fft_size"),
            hop_size=number("hop_size"),
            nb_erb=number("nb_erb"),
            nb_df=number("nb_df"),
            min_nb_erb_freqs=number("min_nb_erb_freqs"),
            norm_tau=config.getfloat("df", "norm_tau"),
            df_order=number("df_order"),
            df_lookahead=number("df_lookahead"),
            conv_lookahead=number("conv_lookahead"),
        )
        if parsed.fft_size != 2 * parsed.hop_size or parsed.conv_lookahead < parsed.df_lookahead:
            # libDF's gains and its noisy reference would then be different frames; DeepFilterNet3
            # has a half-overlap STFT and equal look-aheads.
            raise ValueError("only half-overlap models with conv_lookahead >= df_lookahead")
        return parsed

    @property
    def n_freqs(self) -> int:
        return self.fft_size // 2 + 1

    @property
    def lookahead(self) -> int:
        """DfTract's ``lookahead`` for DeepFilterNet3: the larger of the two."""
        return max(self.conv_lookahead, self.df_lookahead)

    @property
    def history(self) -> int:
        """Noisy spectra kept per stream (``rolling_spec_buf_x``), newest last."""
        return max(self.df_order, self.lookahead)

    @property
    def alpha(self) -> np.float32:
        """``calc_norm_alpha``: the decay, rounded to the fewest decimals (3 or more) below 1."""
        alpha = np.float32(math.exp(-(self.hop_size / self.sample_rate) / self.norm_tau))
        precision = 3
        while True:
            scale = np.float32(10**precision)
            rounded = np.float32(np.round(alpha * scale) / scale)
            if rounded < 1.0:
                return rounded
            precision += 1


def erb_widths(config: DspConfig) -> np.ndarray:
    """Bins per ERB band, as ``erb_fb`` computes them in float32 (they sum to ``n_freqs``)."""

    def freq2erb(hz: np.float32) -> np.float32:
        return np.float32(9.265) * np.log1p(hz / np.float32(24.7 * 9.265), dtype=np.float32)

    def erb2freq(erb: np.float32) -> np.float32:
        return np.float32(24.7 * 9.265) * (np.exp(erb / np.float32(9.265), dtype=np.float32) - 1)

    freq_width = np.float32(config.sample_rate / config.fft_size)
    erb_low = freq2erb(np.float32(0.0))
    erb_high = freq2erb(np.float32(config.sample_rate // 2))
    step = (erb_high - erb_low) / np.float32(config.nb_erb)
    widths = np.zeros(config.nb_erb, np.int64)
    prev_bin = 0
    over = 0
    for band in range(1, config.nb_erb + 1):
        upper = int(np.round(erb2freq(erb_low + np.float32(band) * step) / freq_width))
        width = upper - prev_bin - over
        if width < config.min_nb_erb_freqs:
            over = config.min_nb_erb_freqs - width
            width = config.min_nb_erb_freqs
        else:
            over = 0
        widths[band - 1] = width
        prev_bin = upper
    widths[-1] += 1  # fft_size / 2 + 1 bins
    widths[-1] -= max(0, int(widths.sum()) - config.n_freqs)
    return widths


def _linspace_f32(first: float, last: float, count: int) -> np.ndarray:
    """``min + i * step`` in float32, as ``init_mean_norm_state`` and ``init_unit_norm_state``."""
    step = (np.float32(last) - np.float32(first)) / np.float32(count - 1)
    return (np.float32(first) + np.arange(count, dtype=np.float32) * step).astype(np.float32)


class Dsp:
    """The constants of one model's DSP, and the per-hop steps over a batch of rows."""

    def __init__(self, config: DspConfig) -> None:
        self.config = config
        n = config.fft_size
        half = n // 2
        phase = 0.5 * np.pi * (np.arange(n) + 0.5) / half
        self.window = np.sin(0.5 * np.pi * np.sin(phase) ** 2).astype(np.float32)
        self.alpha = config.alpha
        self.widths = erb_widths(config)
        self.band_starts = np.concatenate([[0], np.cumsum(self.widths)[:-1]])
        # Per bin: 1 / (its band's width), and its band's index (for expanding gains).
        self.bin_scale = np.repeat(
            (np.float32(1.0) / self.widths.astype(np.float32)).astype(np.float32), self.widths
        )
        self.bin_band = np.repeat(np.arange(config.nb_erb), self.widths)
        self.mean_norm_init = _linspace_f32(*MEAN_NORM_INIT, config.nb_erb)
        self.unit_norm_init = _linspace_f32(*UNIT_NORM_INIT, config.nb_df)
        self.pf_bins = config.n_freqs // POST_FILTER_CHUNK * POST_FILTER_CHUNK

    def analysis(self, previous: np.ndarray, hops: np.ndarray) -> np.ndarray:
        """Spectra [rows, n_freqs] of the windowed previous and new hops; ``hops`` is the next
        call's ``previous``."""
        frames = np.concatenate([previous, hops], axis=1) * self.window
        return np.fft.rfft(frames, axis=1, norm="forward").astype(np.complex64, copy=False)

    def synthesis(self, spectra: np.ndarray, overlap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One hop of output per row, and the windowed tail to add to the next one."""
        hop = self.config.hop_size
        inverse = np.fft.irfft(spectra, n=self.config.fft_size, axis=1, norm="forward")
        frames = inverse.astype(np.float32, copy=False) * self.window
        return frames[:, :hop] + overlap, np.ascontiguousarray(frames[:, hop:])

    def erb_features(self, spectra: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Normalised ERB band powers [rows, nb_erb] and the next running mean."""
        power = (spectra.real * spectra.real + spectra.imag * spectra.imag) * self.bin_scale
        bands = np.add.reduceat(power, self.band_starts, axis=1)
        db = np.log10(bands + np.float32(ERB_DB_EPS)) * np.float32(10.0)
        mean = db * (np.float32(1.0) - self.alpha) + mean * self.alpha
        return (db - mean) / np.float32(ERB_NORM_DIVISOR), mean

    def complex_features(
        self, spectra: np.ndarray, unit: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Unit-normalised first ``nb_df`` bins as [rows, 2 (re, im), nb_df], and the next state."""
        low = spectra[:, : self.config.nb_df]
        unit = np.abs(low) * (np.float32(1.0) - self.alpha) + unit * self.alpha
        scale = np.sqrt(unit)
        return np.stack([low.real / scale, low.imag / scale], axis=1), unit

    def enhance(
        self,
        history: np.ndarray,
        gains: np.ndarray,
        coefs: np.ndarray,
        beta: np.ndarray,
        limit: np.ndarray,
    ) -> np.ndarray:
        """The enhanced spectrum of frame ``t - lookahead`` per row.

        ``history`` [rows, history, n_freqs]: noisy spectra, newest last; ``gains`` [rows,
        nb_erb]; ``coefs`` [rows, nb_df, df_order] complex; ``beta`` [rows]: post-filter
        strength, 0 = off; ``limit`` [rows]: the linear attenuation limit, 0 = none.
        """
        cfg = self.config
        noisy = history[:, cfg.history - cfg.lookahead - 1]
        enhanced = noisy * gains[:, self.bin_band]
        filtered = np.zeros((len(history), cfg.nb_df), np.complex64)
        for tap in range(cfg.df_order):
            filtered += history[:, tap, : cfg.nb_df] * coefs[:, :, tap]
        enhanced[:, : cfg.nb_df] = filtered
        if np.any(beta > 0):
            pf = self.pf_bins
            enhanced[:, :pf] *= _post_filter_gain(noisy[:, :pf], enhanced[:, :pf], beta[:, None])
        limit = limit[:, None]
        return enhanced * (np.float32(1.0) - limit) + noisy * limit


def _post_filter_gain(noisy: np.ndarray, enhanced: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``post_filter``'s factor per bin; exactly 1 where beta is 0."""
    eps = np.float32(POST_FILTER_EPS)
    gain = np.clip(np.abs(enhanced) / (np.abs(noisy) + eps), eps, np.float32(1.0))
    gain_sin = gain * np.sin(gain * np.float32(np.pi) / np.float32(2.0))
    ratio = gain / gain_sin
    shaped = (beta + np.float32(1.0)) * gain / (np.float32(1.0) + beta * ratio * ratio)
    return (shaped / gain).astype(np.float32, copy=False)


def attenuation_limit(db: float) -> np.float32:
    """The linear limit ``set_atten_lim`` keeps: 0 (none) from ``NO_LIMIT_DB`` on."""
    if abs(db) >= NO_LIMIT_DB:
        return np.float32(0.0)
    return np.float32(10.0) ** np.float32(-abs(db) / 20.0)
