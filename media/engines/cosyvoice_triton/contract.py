"""The wire contract of CosyVoice's official Triton runtime, and nothing else.

FunAudioLLM/CosyVoice, ``runtime/triton_trtllm``: ``model_repo/cosyvoice2/config.pbtxt``
declares the streaming model and ``client_grpc.py`` calls it:

- model ``cosyvoice2``, Python backend, ``max_batch_size`` 16 (so every tensor has a leading
  batch dimension of 1 here), decoupled when filled with ``decoupled_mode:True`` (``run.sh``
  stage 2; its default, False, answers with one response at the end and is refused here);
- inputs ``reference_wav`` FP32 ``[-1]`` (the prompt clip, 16 kHz mono: the client resamples
  to 16 kHz, "hard coding in server"), ``reference_wav_len`` INT32 ``[1]`` (its length in
  samples), ``reference_text`` STRING ``[1]`` (its transcript) and ``target_text`` STRING
  ``[1]``. The first three are ``optional`` in the current config: without them the model
  speaks with the speaker cached in its ``spk2info.pt`` (``client_grpc.py
  --use-spk2info-cache`` sends ``target_text`` alone);
- output ``waveform`` FP32 ``[-1]``: 24 kHz mono (the client saves ``cosyvoice2`` at 24,000
  Hz), one response per chunk, chunks growing as the model's token hops do;
- the end of an utterance is a flags-only response with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.
  The client sees it only when the request asks for ``triton_enable_empty_final_response``
  (``async_stream_infer(..., enable_empty_final_response=True)`` in ``client_grpc.py``).

Requests and responses are built here from tritonclient's protobuf classes, so the engine can
check the served config against the same names it sends.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import InferResult, model_config_pb2, service_pb2

MODEL_NAME = "cosyvoice2"
REFERENCE_WAV = "reference_wav"
REFERENCE_WAV_LEN = "reference_wav_len"
REFERENCE_TEXT = "reference_text"
TARGET_TEXT = "target_text"
WAVEFORM = "waveform"
REFERENCE_RATE = 16_000  # what the runtime's audio tokenizer and speaker embedding read
OUTPUT_RATE = 24_000  # CosyVoice2's vocoder
# Reserved request parameter (Triton >= 23.06): send an empty response carrying
# ``triton_final_response`` when the model ends a request with flags only.
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"

# name -> (config data type, dims without the batch dimension)
INPUTS: dict[str, tuple[int, tuple[int, ...]]] = {
    REFERENCE_WAV: (model_config_pb2.TYPE_FP32, (-1,)),
    REFERENCE_WAV_LEN: (model_config_pb2.TYPE_INT32, (1,)),
    REFERENCE_TEXT: (model_config_pb2.TYPE_STRING, (1,)),
    TARGET_TEXT: (model_config_pb2.TYPE_STRING, (1,)),
}
REFERENCE_INPUTS = (REFERENCE_WAV, REFERENCE_WAV_LEN, REFERENCE_TEXT)
OUTPUTS: dict[str, tuple[int, tuple[int, ...]]] = {
    WAVEFORM: (model_config_pb2.TYPE_FP32, (-1,)),
}


@dataclass(frozen=True)
class Reference:
    """A voice to speak in: a clip at ``REFERENCE_RATE`` and what it says."""

    audio: np.ndarray  # float32 mono
    text: str

    @property
    def seconds(self) -> float:
        return len(self.audio) / REFERENCE_RATE


@dataclass(frozen=True)
class ServedModel:
    """What the server's config says about the model, as far as requests depend on it."""

    batched: bool  # max_batch_size > 0: every tensor gets a leading batch dimension of 1
    references_optional: bool  # a request may leave out the reference inputs


class ContractError(Exception):
    """The served model does not take what this engine sends; the message says what differs."""


def served_model(config: model_config_pb2.ModelConfig) -> ServedModel:
    """Check a served config against the contract; raises ``ContractError`` naming the part."""
    name = config.name or MODEL_NAME
    if not config.model_transaction_policy.decoupled:
        raise ContractError(
            f"model '{name}' is not decoupled, so it cannot stream: fill its config.pbtxt with "
            "decoupled_mode:True"
        )
    inputs = {tensor.name: tensor for tensor in config.input}
    outputs = {tensor.name: tensor for tensor in config.output}
    for kind, declared, expected in (("input", inputs, INPUTS), ("output", outputs, OUTPUTS)):
        for tensor_name, (data_type, dims) in expected.items():
            tensor = declared.get(tensor_name)
            if tensor is None:
                raise ContractError(f"model '{name}' has no {kind} '{tensor_name}'")
            if tensor.data_type != data_type or tuple(tensor.dims) != dims:
                raise ContractError(
                    f"model '{name}' {kind} '{tensor_name}' is "
                    f"{model_config_pb2.DataType.Name(tensor.data_type)} {list(tensor.dims)}, "
                    f"not {model_config_pb2.DataType.Name(data_type)} {list(dims)}"
                )
    return ServedModel(
        batched=config.max_batch_size > 0,
        references_optional=all(inputs[name].optional for name in REFERENCE_INPUTS),
    )


def _bytes_tensor(text: str) -> bytes:
    """One BYTES element as Triton's raw tensor format has it: a 4-byte length, then UTF-8."""
    data = text.encode("utf-8")
    return struct.pack("<I", len(data)) + data


def _add_input(
    request: service_pb2.ModelInferRequest,
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    raw: bytes,
    batched: bool,
) -> None:
    tensor = request.inputs.add()
    tensor.name = name
    tensor.datatype = datatype
    tensor.shape.extend((1, *shape) if batched else shape)
    request.raw_input_contents.append(raw)


def build_request(
    model: str,
    request_id: str,
    text: str,
    reference: Reference | None,
    served: ServedModel,
) -> service_pb2.ModelInferRequest:
    """One streaming request for ``text``, in ``reference``'s voice (None: the cached one)."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    if reference is not None:
        audio = np.ascontiguousarray(reference.audio, dtype="<f4")
        _add_input(request, REFERENCE_WAV, "FP32", (len(audio),), audio.tobytes(), served.batched)
        length = np.array([len(audio)], dtype="<i4").tobytes()
        _add_input(request, REFERENCE_WAV_LEN, "INT32", (1,), length, served.batched)
        _add_input(
            request, REFERENCE_TEXT, "BYTES", (1,), _bytes_tensor(reference.text), served.batched
        )
    _add_input(request, TARGET_TEXT, "BYTES", (1,), _bytes_tensor(text), served.batched)
    request.outputs.add().name = WAVEFORM
    request.parameters[EMPTY_FINAL_RESPONSE].bool_param = True
    return request


@dataclass(frozen=True)
class Response:
    """One message of the stream: audio, the end, or the server's error."""

    audio: np.ndarray | None  # float32 mono at OUTPUT_RATE
    final: bool
    error: str | None


def read_response(message: service_pb2.ModelStreamInferResponse) -> Response:
    if message.error_message:
        return Response(None, True, message.error_message)
    response = message.infer_response
    final = response.parameters[FINAL_RESPONSE].bool_param
    if not any(output.name == WAVEFORM for output in response.outputs):
        return Response(None, final, None)
    waveform = InferResult(response).as_numpy(WAVEFORM)
    audio = np.asarray(waveform, dtype=np.float32).reshape(-1)
    return Response(audio, final, None)
