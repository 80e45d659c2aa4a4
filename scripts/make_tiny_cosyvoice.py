"""Build a randomly initialised CosyVoice2 model directory, for tests and GPU timing.

    .venv/bin/python -m scripts.make_tiny_cosyvoice OUT_DIR [--full] [--seed N]

The directory has every file a released CosyVoice2-0.5B directory has, built by the same
upstream classes from a yaml of the same shape, so the engines load it through their real
loading code. Sizes upstream's code fixes stay real: 80 mel bins, 6561 speech tokens, the
512-wide flow encoder, 24 kHz output with a 480-sample mel hop. Everything else is tiny by
default (a few seconds to build, ~60 MB); ``--full`` uses CosyVoice2-0.5B's sizes (random
weights, ~4.3 GB, ~25 s) for loading tests and GPU timing. Random weights produce noise,
not speech.

A random LLM never picks its end token on purpose, so the end-of-speech logit gets a large
bias: with end masked until upstream's minimum length (twice the text tokens), every utterance
is exactly that long, which keeps test durations predictable. The text tokenizer is a small
byte-level BPE trained here with ``tokenizers``; the two ONNX front ends are tiny graphs with
the released models' input and output signatures.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SPEECH_TOKENS = 6561  # fixed by the flow's embedding and the LLM's head in upstream code
MEL_BINS = 80
FLOW_ENCODER_WIDTH = 512  # upstream's encoder hard-codes its lookahead and upsampling layers
WHISPER_MELS = 128  # the speech tokenizer's input
EMBEDDING_SIZE = 192
EOS_BIAS = 40.0
ONNX_OPSET = 18  # ReduceMean takes its axes as an input from opset 18 on
SPEAKERS = ("tiny-a", "tiny-b")
PROMPT_TOKENS = 30  # the zero-shot speaker's prompt: 1.2 s of speech tokens
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello there, how are you today? "
    "Streaming speech should start long before the sentence is finished. "
    "Numbers like 42 and 1999, punctuation: commas, periods; questions? Yes! "
    "A small tokenizer for tests, trained on a few sentences of English text."
)


@dataclass(frozen=True)
class Sizes:
    qwen_hidden: int
    qwen_layers: int
    qwen_heads: int
    qwen_kv_heads: int
    qwen_intermediate: int
    qwen_vocab: int
    encoder_heads: int
    encoder_units: int
    encoder_blocks: int
    decoder_channels: int
    decoder_head_dim: int
    decoder_heads: int
    decoder_blocks: int
    decoder_mid_blocks: int
    hift_channels: int
    f0_channels: int
    bpe_vocab: int


TINY = Sizes(64, 2, 4, 2, 128, 1024, 2, 64, 1, 32, 16, 2, 1, 1, 32, 32, 400)
FULL = Sizes(896, 24, 14, 2, 4864, 151936, 8, 2048, 6, 256, 64, 8, 4, 12, 512, 512, 400)


def config_yaml(sizes: Sizes) -> str:
    """A cosyvoice2.yaml laid out as the released one: every block it has, in its order,
    training helpers (data pipeline, GAN discriminators, optimiser settings) included."""
    return f"""# built by scripts/make_tiny_cosyvoice.py: random weights
# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]
sample_rate: 24000
llm_input_size: {sizes.qwen_hidden}
llm_output_size: {sizes.qwen_hidden}
spk_embed_dim: {EMBEDDING_SIZE}
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {SPEECH_TOKENS}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: {FLOW_ENCODER_WIDTH}
    output_size: {MEL_BINS}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {SPEECH_TOKENS}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {FLOW_ENCODER_WIDTH}
        attention_heads: {sizes.encoder_heads}
        linear_units: {sizes.encoder_units}
        num_blocks: {sizes.encoder_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {FLOW_ENCODER_WIDTH}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: {MEL_BINS}
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: {MEL_BINS}
            channels: [{sizes.decoder_channels}]
            dropout: 0.0
            attention_head_dim: {sizes.decoder_head_dim}
            n_blocks: {sizes.decoder_blocks}
            num_mid_blocks: {sizes.decoder_mid_blocks}
            num_heads: {sizes.decoder_heads}
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: {MEL_BINS}
    base_channels: {sizes.hift_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: {MEL_BINS}
        cond_channels: {sizes.f0_channels}

# gan related module
mel_spec_transform1: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1024
    num_mels: {MEL_BINS}
    sampling_rate: !ref <sample_rate>
    hop_size: 256
    win_size: 1024
    fmin: 0
    fmax: null
    center: False
hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
    discriminator: !new:cosyvoice.hifigan.discriminator.MultipleDiscriminator
        mpd: !new:matcha.hifigan.models.MultiPeriodDiscriminator
        mrd: !new:cosyvoice.hifigan.discriminator.MultiResolutionDiscriminator
    mel_spec_transform: [
        !ref <mel_spec_transform1>
    ]

# processor functions
parquet_opener: !name:cosyvoice.dataset.processor.parquet_opener
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
allowed_special: 'all'
tokenize: !name:cosyvoice.dataset.processor.tokenize
    get_tokenizer: !ref <get_tokenizer>
    allowed_special: !ref <allowed_special>
filter: !name:cosyvoice.dataset.processor.filter
    max_length: 40960
    min_length: 100
    token_max_length: 200
    token_min_length: 1
resample: !name:cosyvoice.dataset.processor.resample
    resample_rate: !ref <sample_rate>
truncate: !name:cosyvoice.dataset.processor.truncate
    truncate_length: 24480 # must be a multiplier of hop_size
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: {MEL_BINS}
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: False
compute_fbank: !name:cosyvoice.dataset.processor.compute_fbank
    feat_extractor: !ref <feat_extractor>
parse_embedding: !name:cosyvoice.dataset.processor.parse_embedding
    normalize: True
shuffle: !name:cosyvoice.dataset.processor.shuffle
    shuffle_size: 1000
sort: !name:cosyvoice.dataset.processor.sort
    sort_size: 500  # sort_size should be less than shuffle_size
batch: !name:cosyvoice.dataset.processor.batch
    batch_type: 'dynamic'
    max_frames_in_batch: 2000
padding: !name:cosyvoice.dataset.processor.padding
    use_spk_embedding: False # change to True during sft

# dataset processor pipeline
data_pipeline: [
    !ref <parquet_opener>,
    !ref <tokenize>,
    !ref <filter>,
    !ref <resample>,
    !ref <compute_fbank>,
    !ref <parse_embedding>,
    !ref <shuffle>,
    !ref <sort>,
    !ref <batch>,
    !ref <padding>,
]

# llm flow train conf
train_conf:
    optim: adam
    optim_conf:
        lr: 1e-5 # change to 1e-5 during sft
    scheduler: constantlr # change to constantlr during sft
    scheduler_conf:
        warmup_steps: 2500
    max_epoch: 200
    grad_clip: 5
    accum_grad: 2
    log_interval: 100
    save_per_step: -1

# gan train conf
train_conf_gan:
    optim: adam
    optim_conf:
        lr: 0.0002 # use small lr for gan training
    scheduler: constantlr
    optim_d: adam
    optim_conf_d:
        lr: 0.0002 # use small lr for gan training
    scheduler_d: constantlr
    max_epoch: 200
    grad_clip: 5
    accum_grad: 1 # in gan training, accum_grad must be 1
    log_interval: 100
    save_per_step: -1
"""


def write_tokenizer(directory: Path, vocab_size: int) -> int:
    """A byte-level BPE tokenizer in the released files; returns its vocabulary size.

    CosyVoice-BlankEN ships Qwen2's slow-tokenizer files (``vocab.json``, ``merges.txt``,
    ``tokenizer_config.json`` naming ``Qwen2Tokenizer``, ``<|endoftext|>`` as an added
    special token), not a ``tokenizer.json``; these are written the same way.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tokenizer.train_from_iterator([CORPUS], trainer=trainer)
    tokenizer.model.save(str(directory))  # vocab.json and merges.txt
    end = tokenizer.token_to_id("<|endoftext|>")
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(end): {
                "content": "<|endoftext|>",
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tokenizer.get_vocab_size()


def write_qwen(directory: Path, sizes: Sizes, vocab: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=max(sizes.qwen_vocab, vocab + 64),
        hidden_size=sizes.qwen_hidden,
        intermediate_size=sizes.qwen_intermediate,
        num_hidden_layers=sizes.qwen_layers,
        num_attention_heads=sizes.qwen_heads,
        num_key_value_heads=sizes.qwen_kv_heads,
        max_position_embeddings=32768,
        sliding_window=None,  # as released; a window makes transformers warn on every load
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(str(directory))  # type: ignore[attr-defined]


def _graph_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def campplus_onnx(rng: np.random.Generator) -> onnx.ModelProto:
    """fbank (1, frames, 80) -> embedding (1, 192): mean over time, then a random projection."""
    weight = numpy_helper.from_array(
        rng.standard_normal((MEL_BINS, EMBEDDING_SIZE)).astype(np.float32) * 0.1, "weight"
    )
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("ReduceMean", ["input", "axes"], ["mean"], keepdims=0),
        helper.make_node("MatMul", ["mean", "weight"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "campplus",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "frames", MEL_BINS])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, EMBEDDING_SIZE])],
        [weight, axes],
    )
    return _graph_model(graph)


def speech_tokenizer_onnx(rng: np.random.Generator) -> onnx.ModelProto:
    """log-mel (1, 128, frames) at 100 Hz -> tokens (1, frames / 4) at 25 Hz."""
    weight = numpy_helper.from_array(
        rng.standard_normal((WHISPER_MELS, SPEECH_TOKENS)).astype(np.float32), "weight"
    )
    consts = {
        "starts": np.array([0], np.int64),
        "ends": np.array([2**31 - 1], np.int64),
        "axes": np.array([1], np.int64),
        "steps": np.array([4], np.int64),
    }
    initializers = [weight] + [numpy_helper.from_array(v, k) for k, v in consts.items()]
    nodes = [
        helper.make_node("Transpose", ["feats"], ["frames"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["frames", "starts", "ends", "axes", "steps"], ["every4"]),
        helper.make_node("MatMul", ["every4", "weight"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["indices"], axis=2, keepdims=0),
        helper.make_node("Cast", ["indices"], ["tokens"], to=TensorProto.INT32),
    ]
    graph = helper.make_graph(
        nodes,
        "speech_tokenizer",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, WHISPER_MELS, "t"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("tokens", TensorProto.INT32, [1, "n"])],
        initializers,
    )
    return _graph_model(graph)


def build(out: Path, full: bool = False, seed: int = 0) -> Path:
    """Write the model directory ``out`` (created if missing) and return it."""
    import torch

    from media.engines.cosyvoice.modeldir import QWEN_DIR, inference_yaml
    from media.engines.cosyvoice.upstream import import_upstream

    sizes = FULL if full else TINY
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    qwen = out / QWEN_DIR
    qwen.mkdir(exist_ok=True)
    vocab = write_tokenizer(qwen, sizes.bpe_vocab)
    write_qwen(qwen, sizes, vocab)
    yaml_text = config_yaml(sizes)
    (out / "cosyvoice2.yaml").write_text(yaml_text)
    upstream = import_upstream()
    modules = upstream.load_hyperpyyaml(
        inference_yaml(yaml_text), overrides={"qwen_pretrain_path": str(qwen)}
    )
    llm = modules["llm"]
    with torch.no_grad():
        llm.llm_decoder.bias[SPEECH_TOKENS] += EOS_BIAS
    torch.save(llm.state_dict(), out / "llm.pt")
    torch.save(modules["flow"].state_dict(), out / "flow.pt")
    torch.save(modules["hift"].state_dict(), out / "hift.pt")
    onnx.save(campplus_onnx(rng), str(out / "campplus.onnx"))
    onnx.save(speech_tokenizer_onnx(rng), str(out / "speech_tokenizer_v2.onnx"))
    prompt_frames = PROMPT_TOKENS * 2
    spk2info = {
        SPEAKERS[0]: {"embedding": torch.randn(1, EMBEDDING_SIZE)},
        SPEAKERS[1]: {
            "embedding": torch.randn(1, EMBEDDING_SIZE),
            "prompt_text": torch.randint(0, vocab, (1, 12), dtype=torch.int32),
            "flow_prompt_speech_token": torch.randint(
                0, SPEECH_TOKENS, (1, PROMPT_TOKENS), dtype=torch.int32
            ),
            "prompt_speech_feat": torch.randn(1, prompt_frames, MEL_BINS),
        },
    }
    torch.save(spk2info, out / "spk2info.pt")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--full", action="store_true", help="CosyVoice2-0.5B sizes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    began = time.perf_counter()
    build(args.out, args.full, args.seed)
    print(f"wrote {args.out} in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
