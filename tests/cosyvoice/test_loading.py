"""Loading: what the engines need from a model directory, and what they say when it is missing."""

from __future__ import annotations

from pathlib import Path

from media.engines.cosyvoice.modeldir import inference_yaml
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
