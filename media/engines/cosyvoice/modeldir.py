"""Load a CosyVoice2 model directory into shared, read-only modules.

A directory holds ``cosyvoice2.yaml`` (hyperpyyaml: how to build the modules), the weights
``llm.pt``, ``flow.pt`` and ``hift.pt``, two ONNX front-end models (``campplus.onnx``: speaker
embedding; ``speech_tokenizer_v2.onnx``: audio to speech tokens), ``spk2info.pt`` (built-in
speakers) and ``CosyVoice-BlankEN/`` (the Qwen2 config, tokenizer and base weights).

The yaml also names training-time helpers (data pipeline, GAN discriminators, the text
tokenizer factory that imports openai-whisper, the mel extractor that imports librosa).
hyperpyyaml imports everything a file names, so only the blocks inference needs are given to
it: ``llm``, ``flow``, ``hift`` and the plain values they refer to.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from media.engines.base import EngineUnavailable
from media.engines.cosyvoice.upstream import Upstream

CONFIG_FILE = "cosyvoice2.yaml"
REQUIRED_FILES = (
    CONFIG_FILE,
    "llm.pt",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v2.onnx",
    "spk2info.pt",
    "CosyVoice-BlankEN",
)
QWEN_DIR = "CosyVoice-BlankEN"
MODULE_BLOCKS = ("llm", "flow", "hift")
TAGS_THAT_BUILD = ("!new:", "!name:", "!apply:")
HIFT_PREFIX = "generator."  # hift.pt files saved from the GAN wrapper carry it
# Special tokens upstream adds to the Qwen2 tokenizer, in upstream's order: the ids they get
# follow the base vocabulary, and the trained LLM knows them by those ids.
SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endofprompt|>",
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
)
_TOP_LEVEL_KEY = re.compile(r"^([A-Za-z_][\w]*)\s*:")
_REFERENCE = re.compile(r"<([A-Za-z_][\w]*)>")


@dataclass(frozen=True)
class Speaker:
    """A built-in speaker from ``spk2info.pt``: an embedding, with a prompt when it has one."""

    embedding: np.ndarray  # (192,)
    prompt_text: np.ndarray | None = None  # text token ids
    prompt_tokens: np.ndarray | None = None  # speech tokens of the prompt clip
    prompt_feat: np.ndarray | None = None  # (frames, 80) mel of the prompt clip


@dataclass(frozen=True)
class LoadedModel:
    """Everything shared by every session; nothing here changes after loading."""

    upstream: Upstream
    llm: Any  # cosyvoice.llm.llm.Qwen2LM
    flow: Any  # cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    hift: Any  # cosyvoice.hifigan.generator.HiFTGenerator
    tokenizer: Any  # transformers tokenizer with upstream's special tokens
    campplus: ort.InferenceSession
    speech_tokenizer: ort.InferenceSession
    speakers: Mapping[str, Speaker]
    sample_rate: int
    device: str
    # The torch dtype the LLM and the flow compute in; None: float32. The LLM's weights are
    # stored in it (a decode step reads every weight once: it is memory-bound, and weights
    # cast on the fly would cost more than they save); the flow runs under autocast to it
    # (its weights stay float32: its inputs come from outside the model, and autocast casts
    # at each op). HiFT always runs in float32, as in CosyVoice's own runtime.
    precision: Any = None

    def reduced(self) -> contextlib.AbstractContextManager[Any]:
        """The context the flow's calls run in: autocast to ``precision``, if set."""
        if self.precision is None:
            return contextlib.nullcontext()
        device_type = self.device.split(":", 1)[0]
        return self.upstream.torch.autocast(device_type=device_type, dtype=self.precision)


def missing_files(model_dir: Path) -> list[str]:
    return [name for name in REQUIRED_FILES if not (model_dir / name).exists()]


def inference_yaml(text: str) -> str:
    """The yaml reduced to the module blocks and the plain values they may refer to."""
    blocks: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _TOP_LEVEL_KEY.match(line)
        if match:
            if current is not None:
                blocks[current] = "\n".join(lines)
            current, lines = match.group(1), [line]
        elif current is not None:
            lines.append(line)
    if current is not None:
        blocks[current] = "\n".join(lines)
    missing = [name for name in MODULE_BLOCKS if name not in blocks]
    if missing:
        raise EngineUnavailable(f"{CONFIG_FILE} has no {', '.join(missing)} section")
    kept = {
        name: block
        for name, block in blocks.items()
        if name in MODULE_BLOCKS or not any(tag in block for tag in TAGS_THAT_BUILD)
    }
    # Drop blocks that refer to dropped ones, until nothing changes.
    changed = True
    while changed:
        changed = False
        for name in list(kept):
            if name in MODULE_BLOCKS:
                continue
            if any(ref not in kept for ref in _REFERENCE.findall(_strip_comments(kept[name]))):
                del kept[name]
                changed = True
    return "\n".join(kept.values()) + "\n"


def _strip_comments(block: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in block.splitlines())


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _array(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def _speaker(info: Mapping[str, Any]) -> Speaker:
    """Read a ``spk2info`` entry: plain ({embedding}) or a saved zero-shot speaker."""
    embedding = info.get("flow_embedding", info.get("embedding"))
    if embedding is None:
        raise EngineUnavailable("a spk2info.pt entry has no embedding")

    def optional(key: str) -> np.ndarray | None:
        value = info.get(key)
        if value is None:
            return None
        array = _array(value)
        return array if array.size else None

    feat = optional("prompt_speech_feat")
    return Speaker(
        embedding=_array(embedding).reshape(-1).astype(np.float32),
        prompt_text=None if (text := optional("prompt_text")) is None else text.reshape(-1),
        prompt_tokens=None
        if (tokens := optional("flow_prompt_speech_token")) is None
        else tokens.reshape(-1),
        prompt_feat=None if feat is None else feat.reshape(-1, feat.shape[-1]).astype(np.float32),
    )


def load_model(
    upstream: Upstream, model_dir: Path, device: str = "cpu", precision: Any = None
) -> LoadedModel:
    """Build the modules from the yaml and load their weights; errors name the file."""
    torch = upstream.torch
    config_text = (model_dir / CONFIG_FILE).read_text(encoding="utf-8")
    try:
        config = upstream.load_hyperpyyaml(
            inference_yaml(config_text),
            overrides={"qwen_pretrain_path": str(model_dir / QWEN_DIR)},
        )
    except EngineUnavailable:
        raise
    except Exception as exc:
        raise EngineUnavailable(f"{model_dir / CONFIG_FILE} did not build: {exc}") from exc
    modules = {}
    for name in MODULE_BLOCKS:
        module = config[name]
        weights = torch.load(model_dir / f"{name}.pt", map_location=device, weights_only=True)
        if name == "hift":
            weights = {key.removeprefix(HIFT_PREFIX): value for key, value in weights.items()}
        try:
            module.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise EngineUnavailable(f"{model_dir / (name + '.pt')} does not fit: {exc}") from exc
        modules[name] = module.to(device).eval()
    if precision is not None:
        modules["llm"] = modules["llm"].to(precision)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir / QWEN_DIR))
    tokenizer.add_special_tokens(
        {
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": list(SPECIAL_TOKENS),
        }
    )
    spk2info = torch.load(model_dir / "spk2info.pt", map_location="cpu", weights_only=True)
    speakers = {str(name): _speaker(info) for name, info in spk2info.items()}
    return LoadedModel(
        upstream=upstream,
        llm=modules["llm"],
        flow=modules["flow"],
        hift=modules["hift"],
        tokenizer=tokenizer,
        campplus=_session(model_dir / "campplus.onnx"),
        speech_tokenizer=_session(model_dir / "speech_tokenizer_v2.onnx"),
        speakers=speakers,
        sample_rate=int(config.get("sample_rate", modules["hift"].sampling_rate)),
        device=device,
        precision=precision,
    )
