"""Loading: what the engines need from a model directory, and what they say when it is missing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from media.engines.base import EngineUnavailable
from media.engines.cosyvoice.batch_llm import prefill
from media.engines.cosyvoice.flow_window import flow_mel
from media.engines.cosyvoice.loader import SPEAK_PLUGIN, load_speak, use_cpu_convolutions
from media.engines.cosyvoice.modeldir import inference_yaml
from media.engines.cosyvoice.speak import CosyVoiceEngine
from media.engines.cosyvoice.vocoder import VocoderCache, vocode
from media.engines.plugin import EngineSettingsError
from media.engines.registry import EngineRegistry

UPSTREAM_SHAPED_YAML = """\
__set_seed1: !apply:random.seed [1986]
sample_rate: 24000
qwen_pretrain_path: ''
chunk_size: 25 # tokens
llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    static_chunk_size: !ref <chunk_size>
hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    sampling_rate: !ref <sample_rate>
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
tokenize: !name:cosyvoice.dataset.processor.tokenize
    get_tokenizer: !ref <get_tokenizer>
data_pipeline: [
    !ref <tokenize>,
]
train_conf:
    max_epoch: 200
"""


def test_only_the_module_blocks_and_plain_values_reach_hyperpyyaml():
    """The released yaml names whisper- and librosa-based helpers that must not be imported."""
    kept = inference_yaml(UPSTREAM_SHAPED_YAML)
    for name in ("sample_rate:", "qwen_pretrain_path:", "chunk_size:", "llm:", "flow:", "hift:"):
        assert name in kept
    for name in ("__set_seed1", "get_tokenizer", "tokenize", "data_pipeline"):
        assert name not in kept
    assert "train_conf:" in kept and "max_epoch: 200" in kept


def test_without_a_model_directory_the_engines_say_how_to_enable_them():
    registry = EngineRegistry.load(["echo", "cosyvoice", "cosyvoice-vc"])
    assert registry.names == ["echo"]
    for name in ("cosyvoice", "cosyvoice-vc"):
        message = registry.unavailable[name]
        assert "make cosyvoice" in message and "--cosyvoice-model" in message


def test_an_incomplete_model_directory_names_the_missing_files(tmp_path: Path):
    (tmp_path / "cosyvoice2.yaml").write_text("sample_rate: 24000\n")
    registry = EngineRegistry.load(["cosyvoice"], settings={"cosyvoice": {"model": str(tmp_path)}})
    message = registry.unavailable["cosyvoice"]
    assert "llm.pt" in message and "CosyVoice-BlankEN" in message
    assert "cosyvoice2.yaml" not in message.split("missing", 1)[1]


def test_cpu_convolutions_must_be_a_known_kernel_set():
    with pytest.raises(EngineSettingsError, match="native, onednn"):
        SPEAK_PLUGIN.parse_settings({"cpu_convolutions": "fast"})
    assert SPEAK_PLUGIN.parse_settings({"cpu_convolutions": "onednn"})["cpu_convolutions"] == (
        "onednn"
    )


def test_the_llm_step_must_be_a_known_one_and_a_graph_needs_cuda(tiny_model_dir: Path):
    with pytest.raises(EngineSettingsError, match="dynamic, static, graph"):
        SPEAK_PLUGIN.parse_settings({"llm_step": "fast"})
    assert SPEAK_PLUGIN.parse_settings({"llm_step": "static"})["llm_step"] == "static"
    with pytest.raises(EngineUnavailable, match="llm_step=graph needs a CUDA device"):
        load_speak({"model": tiny_model_dir, "llm_step": "graph"})


def test_a_cpu_model_runs_torchs_own_convolutions(speak_engine: CosyVoiceEngine):
    assert not torch._C._get_mkldnn_enabled()
    assert not torch._C._get_nnpack_enabled()


def test_the_convolution_kernels_do_not_change_the_audio(speak_engine: CosyVoiceEngine):
    """oneDNN and torch's own kernels differ only by rounding; the mel and waveform agree."""
    model = speak_engine.model
    prompt = speak_engine.new_state(speak_engine.validate_options({})).prompt.flow
    tokens = np.random.default_rng(3).integers(0, 6561, 40).astype(np.int32)

    def render(kernels: str) -> tuple[torch.Tensor, np.ndarray]:
        use_cpu_convolutions(torch, kernels)
        with torch.inference_mode():
            mel = flow_mel(model.flow, prompt, tokens, 0, 37, True, 100, speak_engine.chunk)
            torch.manual_seed(5)  # HiFT's excitation draws its noise from the global generator
            audio = vocode(model.hift, VocoderCache(), mel, final=True)
        return mel, audio

    try:
        onednn_mel, onednn_audio = render("onednn")
        native_mel, native_audio = render("native")
    finally:
        use_cpu_convolutions(torch, "native")
    assert onednn_mel.shape == native_mel.shape and len(native_audio) == 37 * 2 * 480
    assert torch.allclose(onednn_mel, native_mel, atol=1e-3)
    assert np.abs(onednn_audio - native_audio).max() < 1e-3


def test_the_precision_must_be_a_known_one():
    with pytest.raises(EngineSettingsError, match="float32, bfloat16, float16"):
        SPEAK_PLUGIN.parse_settings({"precision": "int8"})


@pytest.fixture(scope="module")
def bfloat16_engine(tiny_model_dir: Path) -> Iterator[CosyVoiceEngine]:
    engine = load_speak({"model": tiny_model_dir, "precision": "bfloat16"})
    yield engine
    engine.close()


def test_in_bfloat16_the_llm_and_flow_stay_close_to_float32_and_hift_stays_float32(
    speak_engine: CosyVoiceEngine, bfloat16_engine: CosyVoiceEngine
):
    """Reduced precision cannot give equal output; on a CPU it must give nearly the same:
    the same prompt's hidden state and the same hop's mel pointing the same way."""
    full, reduced = speak_engine.model, bfloat16_engine.model
    assert reduced.llm.llm_decoder.weight.dtype == torch.bfloat16
    assert reduced.flow.input_embedding.weight.dtype == torch.float32  # autocast, not cast
    assert next(reduced.hift.parameters()).dtype == torch.float32
    inputs = torch.randn(1, 40, full.llm.llm.model.model.config.hidden_size)
    with torch.inference_mode():
        ours, low_hidden = (
            prefill(model.llm.llm.model.model, inputs.to(model.llm.llm_decoder.weight))[0]
            for model in (full, reduced)
        )
        similarity = F.cosine_similarity(ours, low_hidden.float()).item()
    assert similarity > 0.99
    prompt = speak_engine.new_state(speak_engine.validate_options({"speaker": "tiny-a"})).prompt
    tokens = np.random.default_rng(4).integers(0, 6561, 40).astype(np.int32)
    with torch.inference_mode():
        mel = flow_mel(full.flow, prompt.flow, tokens, 0, 37, True, 100, speak_engine.chunk)
        with reduced.reduced():
            low = flow_mel(reduced.flow, prompt.flow, tokens, 0, 37, True, 100, speak_engine.chunk)
    assert not torch.equal(low.float(), mel)  # it did run in bfloat16
    # Measured on the tiny model: 0.9973 (mean error 0.08 on log mels of spread 1.4: the
    # flow's solver steps add up bfloat16's rounding); float32 against itself gives 1.
    assert F.cosine_similarity(low.float().flatten(), mel.flatten(), dim=0).item() > 0.99


def test_a_bfloat16_engine_speaks_whole_hops(bfloat16_engine: CosyVoiceEngine):
    state = bfloat16_engine.new_state(bfloat16_engine.validate_options({"seed": 1}))
    chunks = list(bfloat16_engine.synthesize(state, "Hello there.", threading.Event()))
    audio = np.concatenate(chunks)
    assert len(chunks) >= 1 and np.isfinite(audio).all() and np.abs(audio).max() > 0
    assert audio.dtype == np.float32
