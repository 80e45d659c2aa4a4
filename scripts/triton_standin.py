"""A real Triton server serving a stand-in for CosyVoice's official streaming model.

    .venv/triton/bin/python scripts/triton_standin.py --grpc-port 8001 --workdir /tmp/standin

The model has exactly the official runtime's name, inputs and outputs
(FunAudioLLM/CosyVoice, ``runtime/triton_trtllm/model_repo/cosyvoice2/config.pbtxt``, filled
as ``run.sh`` fills it, but decoupled), so ``cosyvoice-triton`` talks to it as to the real
one. Instead of a voice it streams a deterministic tone: its pitch encodes the target text
(``pitch_hz``), its length grows with the text (``seconds_for``), ``--chunk-ms`` of 24 kHz
audio per response, one response every ``--interval-ms``, the first after
``--first-delay-ms`` (the real runtime takes ~200 ms on a GPU). It records what it sees, one JSON
object a line, to ``--events``: each request (its texts and reference), each chunk sent,
and each request found cancelled (the client closed the stream), with ``time.monotonic()``
stamps comparable with the tests' own on the same machine. A target text starting with
``fail:`` fails after its first chunk, as a model that raises does.

The server is the CPU ``tritonserver`` and Python backend inside the ``nvidia-pytriton``
wheel, whose Python backend needs numpy < 2, so this runs from its own environment
(``make triton-standin`` builds ``.venv/triton``). The process execs ``tritonserver`` in a
process group of its own, so its pid is the server's and the group's: killing the group ends
the server and its backend stub (which, killed alone mid-stream, the stub outlives). It
listens on 127.0.0.1 only (gRPC; no HTTP, no metrics).

The same file is the model: it is copied into the model repository as ``model.py``, where
Triton's Python backend imports it and finds ``TritonPythonModel``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any, TextIO

import numpy as np

MODEL_NAME = "cosyvoice2"
RATE = 24_000
AMPLITUDE = 0.3
FAIL_PREFIX = "fail:"

# The official config with run.sh's values (TRITON_MAX_BATCH_SIZE=16,
# MAX_QUEUE_DELAY_MICROSECONDS=0), decoupled for streaming; one instance is enough here, as
# each request streams from a thread of its own. The stand-in's own knobs are parameters.
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 16
dynamic_batching {{
    max_queue_delay_microseconds: 0
}}
model_transaction_policy {{
  decoupled: True
}}
parameters [
  {{ key: "chunk_ms", value: {{string_value: "{chunk_ms}"}} }},
  {{ key: "interval_ms", value: {{string_value: "{interval_ms}"}} }},
  {{ key: "first_delay_ms", value: {{string_value: "{first_delay_ms}"}} }},
  {{ key: "events", value: {{string_value: "{events}"}} }}
]

input [
  {{
    name: "reference_wav"
    data_type: TYPE_FP32
    dims: [-1]
    optional: true
  }},
  {{
    name: "reference_wav_len"
    data_type: TYPE_INT32
    dims: [1]
    optional: true
  }},
  {{
    name: "reference_text"
    data_type: TYPE_STRING
    dims: [1]
    optional: true
  }},
  {{
    name: "target_text"
    data_type: TYPE_STRING
    dims: [1]
  }}
]
output [
  {{
    name: "waveform"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }}
]

instance_group [
  {{
    count: 1
    kind: KIND_CPU
  }}
]
"""


def pitch_hz(text: str) -> float:
    """The tone that speaks ``text``: 200-592 Hz in 8 Hz steps, from a checksum of it."""
    return 200.0 + 8.0 * (zlib.crc32(text.encode("utf-8")) % 50)


def seconds_for(text: str) -> float:
    """How long ``text`` is spoken: 50 ms a character, within 0.2-30 s."""
    return min(max(0.05 * len(text), 0.2), 30.0)


def tone(text: str, start: int, count: int) -> np.ndarray:
    """Samples ``start`` to ``start + count`` of the tone for ``text`` (continuous phase)."""
    index = np.arange(start, start + count, dtype=np.float64)
    return (AMPLITUDE * np.sin(2 * np.pi * pitch_hz(text) * index / RATE)).astype(np.float32)


# --- the model, inside Triton's Python backend ---------------------------------------------

pb_utils: Any = None  # triton_python_backend_utils, importable only inside the backend


class TritonPythonModel:
    """Streams the tone for each request from a thread of its own (decoupled)."""

    def initialize(self, args: dict[str, Any]) -> None:
        global pb_utils
        import triton_python_backend_utils

        pb_utils = triton_python_backend_utils
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config["parameters"].items()}
        self.chunk = RATE * int(params["chunk_ms"]) // 1000
        self.interval = int(params["interval_ms"]) / 1000
        self.first_delay = int(params["first_delay_ms"]) / 1000
        self._log: TextIO = open(params["events"], "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._log_lock = threading.Lock()

    def record(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "at": time.monotonic(), **fields})
        with self._log_lock:
            self._log.write(line + "\n")

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            threading.Thread(target=self._stream, args=(request,), daemon=True).start()
        return None

    @staticmethod
    def _text(request: Any, name: str) -> str | None:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy().reshape(-1)[0].decode("utf-8")

    def _stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        request_id = request.request_id()
        try:
            text = self._text(request, "target_text") or ""
            wav = pb_utils.get_input_tensor_by_name(request, "reference_wav")
            length = pb_utils.get_input_tensor_by_name(request, "reference_wav_len")
            self.record(
                "request",
                id=request_id,
                target_text=text,
                reference_text=self._text(request, "reference_text"),
                reference_shape=None if wav is None else list(wav.as_numpy().shape),
                reference_samples=None if length is None else int(length.as_numpy()[0][0]),
            )
            total = round(seconds_for(text) * RATE)
            time.sleep(self.first_delay)
            sent = index = 0
            while sent < total:
                if sender.is_cancelled():
                    self.record("cancelled", id=request_id, chunks=index)
                    sender.send(flags=final)
                    return
                if index == 1 and text.startswith(FAIL_PREFIX):
                    raise RuntimeError("the stand-in was asked to fail")
                count = min(self.chunk, total - sent)
                waveform = pb_utils.Tensor("waveform", tone(text, sent, count).reshape(1, -1))
                sender.send(pb_utils.InferenceResponse(output_tensors=[waveform]))
                self.record("chunk", id=request_id, index=index)
                sent += count
                index += 1
                time.sleep(self.interval)
            sender.send(flags=final)
            self.record("finished", id=request_id, chunks=index)
        except Exception as exc:
            self.record("failed", id=request_id, error=str(exc))
            error = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
            sender.send(error, flags=final)

    def finalize(self) -> None:
        self._log.close()


# --- the launcher -----------------------------------------------------------------------


def shm_prefix(pid: int) -> str:
    """The names of the server's shared-memory regions in /dev/shm (the launcher's pid is the
    server's). A killed server leaves them behind: whoever kills it removes them."""
    return f"triton_standin_{pid}_"


def _pytriton_root() -> Path:
    """Where the nvidia-pytriton wheel put its package, without importing it."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nvidia-pytriton is not installed here: run `make triton-standin`")
    return Path(next(iter(spec.submodule_search_locations)))


def prepare(
    workdir: Path, name: str, chunk_ms: int, interval_ms: int, first_delay_ms: int, events: Path
) -> list[str]:
    """Lay out the model repository and the backend directory; return tritonserver's argv."""
    root = _pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise SystemExit(f"nvidia-pytriton has no Python backend stub for Python {version}")
    model = workdir / "models" / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    config = CONFIG.format(
        name=name,
        chunk_ms=chunk_ms,
        interval_ms=interval_ms,
        first_delay_ms=first_delay_ms,
        events=events,
    )
    (model / "config.pbtxt").write_text(config, encoding="utf-8")
    shutil.copyfile(__file__, model / "1" / "model.py")
    backends = workdir / "backends"
    shutil.copytree(root / "tritonserver" / "backends", backends, dirs_exist_ok=True)
    shutil.copy(stub, backends / "python" / "triton_python_backend_stub")
    events.touch()
    return [
        str(root / "tritonserver" / "bin" / "tritonserver"),
        f"--model-repository={workdir / 'models'}",
        f"--backend-directory={backends}",
        "--grpc-address=127.0.0.1",
        "--allow-http=false",
        "--allow-metrics=false",
        "--exit-timeout-secs=2",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix(os.getpid())}",
        "--log-warning=true",
        "--log-info=false",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--workdir", type=Path, help="model repository and logs (default: temp)")
    parser.add_argument("--events", type=Path, help="JSON lines of what the model sees")
    parser.add_argument("--model-name", default=MODEL_NAME)
    parser.add_argument("--chunk-ms", type=int, default=20, help="audio per response")
    parser.add_argument("--interval-ms", type=int, default=10, help="pause after each response")
    parser.add_argument(
        "--first-delay-ms", type=int, default=0, help="time to first audio (the runtime's ~200)"
    )
    args = parser.parse_args()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="triton-standin-"))).resolve()
    events = (args.events or workdir / "events.jsonl").resolve()
    argv = prepare(
        workdir, args.model_name, args.chunk_ms, args.interval_ms, args.first_delay_ms, events
    )
    argv.append(f"--grpc-port={args.grpc_port}")
    env = dict(os.environ)
    libs = str(_pytriton_root().parent / "nvidia_pytriton.libs")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libs, env.get("LD_LIBRARY_PATH")]))
    # The backend's stub embeds Python; it finds this environment's numpy through PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    sys.stdout.flush()
    os.setpgid(0, 0)
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()
