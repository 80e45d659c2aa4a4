"""``cosyvoice-triton``: CosyVoice2 text to speech from a Triton Inference Server.

The server runs CosyVoice's official runtime (FunAudioLLM/CosyVoice, ``runtime/triton_trtllm``,
model ``cosyvoice2`` with ``decoupled_mode:True``), usually on a GPU shared by many nodes; this
process only streams requests and audio over gRPC (``tritonclient[grpc]``'s protocol classes
on a ``grpc.aio`` channel). Enable it with ``--engine-setting cosyvoice-triton.url=HOST:PORT``.

Importing this package imports nothing from gRPC: ``plugin.load`` does, when the registry
loads the engine.

Modules, one job each:

- ``contract``: the runtime's model name, tensors, rates, and requests and responses;
- ``link``: the channel, its health and reconnection, on a loop thread of its own;
- ``stream``: one utterance's gRPC stream, its cancellation and its errors;
- ``media.engines.streamed_frames``: the bounded queue from the stream to the synthesis thread,
  in 20 ms frames (shared with the model host's client);
- ``voices``: the cached speaker, the operator's named clips, a session's prompt;
- ``engine``: the speak engine; ``plugin``: its settings and loading.

``scripts/triton_standin.py`` serves a stand-in model under the runtime's exact name, inputs
and outputs from the CPU ``tritonserver`` inside ``nvidia-pytriton`` (``make triton-standin``
builds its environment); ``tests/triton`` runs calls against it.
"""
