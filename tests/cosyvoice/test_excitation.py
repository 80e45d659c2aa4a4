"""HiFT's excitation with its noise drawn once a sample: upstream's distribution, exactly."""

from __future__ import annotations

import torch

from media.engines.cosyvoice.speak import CosyVoiceEngine
from media.engines.cosyvoice.vocoder import _excitation

ROWS, HALF = 64, 4800  # 64 rows of 0.2 s voiced (150 Hz), then 0.2 s unvoiced


def residual_std(source_module, excitation: torch.Tensor, f0: torch.Tensor, seed: int):
    """Std of the noise in ``excitation`` (before the tanh), voiced and unvoiced halves.

    The noiseless part is rebuilt from the same seed: the sine phases are the first thing
    either path draws."""
    generator = source_module.l_sin_gen
    torch.manual_seed(seed)
    harmonics = torch.arange(1, generator.dim + 1, dtype=f0.dtype)
    sines = generator._f02sine(f0 * harmonics) * generator.sine_amp
    clean = source_module.l_linear(sines * generator._f02uv(f0))
    noise = torch.atanh(excitation) - clean
    return noise[:, :HALF].std().item(), noise[:, HALF:].std().item(), noise.mean().item()


def test_the_excitation_has_upstreams_noise_in_one_draw_a_sample(speak_engine: CosyVoiceEngine):
    source_module = speak_engine.model.hift.m_source
    generator = source_module.l_sin_gen
    f0 = torch.cat([torch.full((ROWS, HALF, 1), 150.0), torch.zeros(ROWS, HALF, 1)], dim=1)
    weight = torch.linalg.vector_norm(source_module.l_linear.weight).item()
    expected = (generator.noise_std * weight, generator.sine_amp / 3 * weight)
    with torch.inference_mode():
        torch.manual_seed(1)
        upstream = source_module(f0)[0]
        torch.manual_seed(1)
        ours = _excitation(source_module, f0)
        for excitation in (upstream, ours):
            voiced, unvoiced, mean = residual_std(source_module, excitation, f0, 1)
            assert abs(voiced / expected[0] - 1) < 0.03, (voiced, expected)
            assert abs(unvoiced / expected[1] - 1) < 0.03, (unvoiced, expected)
            assert abs(mean) < 0.01 * expected[1]
