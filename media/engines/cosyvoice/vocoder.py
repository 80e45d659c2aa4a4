"""Mel to waveform in chunks with HiFT, keeping one session's continuity in a small cache.

HiFT is convolutional and sees a few frames either side, and its neural source filter draws a
random phase per call. Rendering chunks independently would click at every join. So each
session keeps, between chunks, upstream's three caches: the last ``MEL_CACHE_FRAMES`` mel
frames (rendered again at the start of the next chunk, now with their right context), the
excitation signal under them (reused, so the re-rendering is in phase) and the audio they
produced the first time (crossfaded with the second rendering). That audio is held back from
the chunk that produced it, so each join costs ``MEL_CACHE_FRAMES`` frames (160 ms) of
latency, once, not per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from media.engines.cosyvoice.crossfade import crossfade

MEL_CACHE_FRAMES = 8
SAMPLES_PER_FRAME = 480  # 24 kHz, 50 mel frames per second
OVERLAP_SAMPLES = MEL_CACHE_FRAMES * SAMPLES_PER_FRAME


@dataclass(eq=False)
class VocoderCache:
    """One utterance's continuity across chunks (None before its first chunk)."""

    mel: torch.Tensor | None = None  # (1, 80, MEL_CACHE_FRAMES)
    source: torch.Tensor | None = None  # (1, 1, OVERLAP_SAMPLES)
    tail: np.ndarray | None = None  # (OVERLAP_SAMPLES,) rendered once, not yet sent

    def replace_held_mel(self) -> None:
        """The next chunk's mel begins with a new rendering of the held frames: use it.

        For a hop whose held frames were rendered before their attention chunk was complete
        (``schedule.py``): the next call renders the new frames in place of the held ones,
        over the held excitation, and crossfades from the held audio, so the early
        rendering hands over to the exact one without a seam.
        """
        self.mel = None


def vocode(hift: Any, cache: VocoderCache, mel: torch.Tensor, final: bool) -> np.ndarray:
    """Render ``mel`` (1, 80, frames) after what ``cache`` holds; return the audio to send.

    Not final: everything but the last ``OVERLAP_SAMPLES`` (kept for the next join). Final:
    everything, and the cache is emptied.
    """
    return vocode_batch(hift, [cache], [mel], [final])[0]


def vocode_batch(
    hift: Any, caches: list[VocoderCache], mels: list[torch.Tensor], finals: list[bool]
) -> list[np.ndarray]:
    """``vocode`` for several utterances; those whose inputs have the same shape share a call.

    HiFT's convolutions see both ways in time, so rows of different lengths cannot be padded
    into one call without changing their last frames; equal shapes are common, since
    utterances that start together take hops of the same sizes.
    """
    inputs = []
    for cache, mel in zip(caches, mels, strict=True):
        if cache.mel is not None:
            mel = torch.cat([cache.mel, mel], dim=2)
        source = cache.source if cache.source is not None else mel.new_zeros(1, 1, 0)
        inputs.append((mel, source))
    groups: dict[tuple[int, int], list[int]] = {}
    for index, (mel, source) in enumerate(inputs):
        if mel.shape[2]:
            groups.setdefault((mel.shape[2], source.shape[2]), []).append(index)
    rendered: dict[int, tuple[np.ndarray, torch.Tensor]] = {}
    with torch.inference_mode():
        for members in groups.values():
            mel = torch.cat([inputs[index][0] for index in members])
            source = torch.cat([inputs[index][1] for index in members])
            speech, excitation = _hift_inference(hift, mel, source)
            audio = speech.detach().cpu().numpy().astype(np.float32)
            for row, index in enumerate(members):
                rendered[index] = (audio[row], excitation[row : row + 1])
    out = []
    for index, (cache, final) in enumerate(zip(caches, finals, strict=True)):
        if index not in rendered:
            out.append(np.zeros(0, np.float32))
            continue
        audio, excitation = rendered[index]
        out.append(_join(cache, inputs[index][0], audio, excitation, final))
    return out


def _join(
    cache: VocoderCache, mel: torch.Tensor, audio: np.ndarray, excitation: torch.Tensor, final: bool
) -> np.ndarray:
    """Crossfade with what the cache held back, and hold back this chunk's tail."""
    if cache.tail is not None:
        overlap = min(len(cache.tail), len(audio))
        audio[:overlap] = crossfade(cache.tail[:overlap], audio[:overlap])
    if final:
        cache.mel = cache.source = cache.tail = None
        return audio
    cache.mel = mel[:, :, -MEL_CACHE_FRAMES:]
    cache.source = excitation[:, :, -OVERLAP_SAMPLES:]
    cache.tail = audio[-OVERLAP_SAMPLES:].copy()
    return audio[: max(0, len(audio) - OVERLAP_SAMPLES)]


def _hift_inference(
    hift: Any, mel: torch.Tensor, cache_source: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's ``HiFTGenerator.inference``, its excitation drawn by ``_excitation``."""
    source_module = hift.m_source
    if not hasattr(source_module.l_sin_gen, "_f02sine"):  # not the 24 kHz source: as is
        return hift.inference(speech_feat=mel, cache_source=cache_source)
    f0 = hift.f0_predictor(mel)
    source = _excitation(source_module, hift.f0_upsamp(f0[:, None]).transpose(1, 2))
    source = source.transpose(1, 2)
    if cache_source.shape[2]:
        source[:, :, : cache_source.shape[2]] = cache_source
    return hift.decode(x=mel, s=source), source


def _excitation(source_module: Any, f0: torch.Tensor) -> torch.Tensor:
    """``SourceModuleHnNSF2.forward`` for f0 (B, samples, 1) in Hz: the excitation (B, samples, 1).

    Upstream adds Gaussian noise to each of the harmonics and then mixes them with one linear
    layer: tanh(w . (sines * uv + amp * z) + b) with z ~ N(0, I) per harmonic. The mixed
    noise w . amp z is one Gaussian of standard deviation amp * |w|, so it is drawn as one
    value a sample instead of one a harmonic (upstream also draws a second noise tensor that
    it returns unused). Same distribution, a tenth of the draws: torch's CPU normal sampler
    costs ~20 ns a value, a quarter of a batched HiFT call on the tiny model.
    """
    generator = source_module.l_sin_gen
    harmonics = torch.arange(1, generator.dim + 1, device=f0.device, dtype=f0.dtype)
    sines = generator._f02sine(f0 * harmonics) * generator.sine_amp
    uv = generator._f02uv(f0)
    amplitude = uv * generator.noise_std + (1 - uv) * generator.sine_amp / 3
    mixer = source_module.l_linear
    noise = amplitude * torch.linalg.vector_norm(mixer.weight) * torch.randn_like(uv)
    return source_module.l_tanh(mixer(sines * uv) + noise)
