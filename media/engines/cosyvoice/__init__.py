"""CosyVoice2 engines: ``cosyvoice`` (streaming text to speech) and ``cosyvoice-vc``.

Enable them with ``make cosyvoice`` (torch 2.13 CPU, the upstream neural modules from
``cosyvoice-minicpmo`` installed ``--no-deps``, ``requirements/cosyvoice.txt``) and a
CosyVoice2 model directory: ``cosyvoice2.yaml``, ``llm.pt``, ``flow.pt``, ``hift.pt``,
``campplus.onnx``, ``speech_tokenizer_v2.onnx``, ``spk2info.pt`` and ``CosyVoice-BlankEN/``.
The ``cosyvoice`` settings namespace says where they are (``model``, and ``src``: a checkout
of the upstream repository to import instead of the installed package), filled from
``--engine-setting cosyvoice.model=DIR`` (or ``--cosyvoice-model``). Without a model both
engines are listed as unavailable, with a message saying this, and the server starts
normally.

Importing this package imports nothing heavy: torch and the upstream modules are imported when
the registry loads the engines (``loader.load_speak``, ``loader.load_vc``).

Modules, one job each:

- ``upstream``: importing the upstream modules (package or checkout), with stand-ins for the
  two imports inference does not need;
- ``modeldir``: reading a model directory into shared, read-only modules;
- ``features``: Whisper log-mel, Kaldi filter banks and the prompt mel, without torchaudio,
  librosa or whisper;
- ``prompts``: built-in speakers and zero-shot prompt clips, analysed once;
- ``sampling``, ``tokens``, ``bistream``: the LLM, token by token, in a cancellable worker;
- ``schedule``, ``flow_window``, ``vocoder``, ``crossfade``, ``synthesis``: the streaming
  scheduler, from tokens to audio chunks with per-utterance caches;
- ``batch_llm``, ``flow_batch``, ``batcher``: every utterance of a worker in one loop, one
  LLM step for all and the ready hops' flow and HiFT in shared calls (the default);
- ``speak``, ``vc``: the two engines; ``loader``: settings and the shared model.

``scripts/make_tiny_cosyvoice.py`` builds a random model directory for tests (``--full``:
real sizes in the published layout); ``bench/cosyvoice.py`` measures first-chunk latency,
real-time factor and CPU per audio second at 1-16 concurrent streams, sequential, batched
and on Triton; ``bench/gpu/check.sh`` runs it at real size on a GPU.
"""
