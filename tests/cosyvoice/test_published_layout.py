"""A model directory laid out as the published CosyVoice2-0.5B, at its real sizes, loads and speaks.

The weights are random (no weights can be downloaded here), written by
``scripts/make_tiny_cosyvoice.py --full`` in the published layout: ``cosyvoice2.yaml`` with
every block the released file has (training pipeline, GAN and optimiser sections included),
``llm.pt``, ``flow.pt``, ``hift.pt``, the two ONNX front ends, ``spk2info.pt`` and
``CosyVoice-BlankEN/`` with Qwen2's slow-tokenizer files. The full-size check runs in a
child process, so the ~5 GB it loads is returned when it ends.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from scripts.make_tiny_cosyvoice import build

# The released file's top-level keys, in its order.
PUBLISHED_KEYS = (
    "__set_seed1",
    "__set_seed2",
    "__set_seed3",
    "__set_seed4",
    "sample_rate",
    "llm_input_size",
    "llm_output_size",
    "spk_embed_dim",
    "qwen_pretrain_path",
    "token_frame_rate",
    "token_mel_ratio",
    "chunk_size",
    "num_decoding_left_chunks",
    "llm",
    "flow",
    "hift",
    "mel_spec_transform1",
    "hifigan",
    "parquet_opener",
    "get_tokenizer",
    "allowed_special",
    "tokenize",
    "filter",
    "resample",
    "truncate",
    "feat_extractor",
    "compute_fbank",
    "parse_embedding",
    "shuffle",
    "sort",
    "batch",
    "padding",
    "data_pipeline",
    "train_conf",
    "train_conf_gan",
)
BLANK_EN_FILES = {
    "config.json",
    "generation_config.json",
    "merges.txt",
    "model.safetensors",
    "tokenizer_config.json",
    "vocab.json",
}
QWEN2_05B_BODY_PARAMETERS = 494_032_768  # Qwen2-0.5B with its 151,936-word embedding


def test_the_directory_has_the_published_files_and_yaml_sections(tiny_model_dir: Path):
    yaml = (tiny_model_dir / "cosyvoice2.yaml").read_text()
    keys = tuple(re.findall(r"^([A-Za-z_][\w]*):", yaml, flags=re.MULTILINE))
    assert keys == PUBLISHED_KEYS
    assert {p.name for p in (tiny_model_dir / "CosyVoice-BlankEN").iterdir()} == BLANK_EN_FILES


def load_and_speak(model_dir: str) -> dict[str, Any]:
    """In a child process: build the full-size directory, load it as the server does, speak."""
    import resource

    from media.engines.registry import EngineRegistry

    build(Path(model_dir), full=True)
    registry = EngineRegistry.load(["cosyvoice"], settings={"cosyvoice": {"model": model_dir}})
    try:
        assert not registry.unavailable, registry.unavailable
        engine: Any = registry.get("cosyvoice")
        body = engine.model.llm.llm.model.model
        state = engine.new_state(engine.validate_options({"seed": 1}))
        samples = sum(len(c) for c in engine.synthesize(state, "Hello there.", threading.Event()))
        return {
            "body_parameters": sum(p.numel() for p in body.parameters()),
            "hidden": body.config.hidden_size,
            "layers": body.config.num_hidden_layers,
            "tokenizer": type(engine.model.tokenizer).__name__,
            "samples": samples,
            "batched": engine.batcher is not None,
            "max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        }
    finally:
        registry.close()


@pytest.mark.timeout(300)
def test_real_size_random_weights_in_the_published_layout_load_and_speak(tmp_path: Path):
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        facts = pool.submit(load_and_speak, str(tmp_path / "CosyVoice2-0.5B")).result(280)
    assert facts["body_parameters"] == QWEN2_05B_BODY_PARAMETERS
    assert (facts["hidden"], facts["layers"]) == (896, 24)
    assert facts["tokenizer"].startswith("Qwen2Tokenizer")
    assert facts["batched"] and facts["samples"] > 0
