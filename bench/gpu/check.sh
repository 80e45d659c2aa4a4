#!/usr/bin/env bash
# CosyVoice2 at its real size on one GPU: sequential against batched, 1/4/8/16 streams.
#
#     bash bench/gpu/check.sh            (from the repository root, on a machine with CUDA)
#
# The batched rows run twice: with the LLM step as on a CPU (cosyvoice.llm_step=dynamic) and
# captured as a CUDA graph (graph, rows "batched-graph"), on the same loaded model. A second
# run (BF16_SECONDS, default 150) repeats 1 and 16 streams with the LLM in bfloat16 and the
# flow under autocast (cosyvoice.precision=bfloat16): bench/results/cosyvoice-gpu-bf16.json.
#
# Builds a CosyVoice2-0.5B directory with random weights (the published layout, ~4.3 GB,
# ~25 s; kept in COSYRTC_GPU_MODEL for a rerun), then runs bench.cosyvoice on cuda: each
# concurrency level once per mode, first chunk p50/p95, real-time factor and CPU seconds per
# audio second, one table on stdout and bench/results/cosyvoice-gpu.json. Random weights make
# noise, not speech, but every model call has its real shape and cost. It needs the project's
# environment with a CUDA build of torch 2.13 (PYTHON= another interpreter) and stops after
# CHECK_SECONDS (default 330) and BF16_SECONDS so the whole check fits in 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
MODEL=${COSYRTC_GPU_MODEL:-/tmp/cosyrtc-cosyvoice2-0.5b}
CHECK_SECONDS=${CHECK_SECONDS:-330}
BF16_SECONDS=${BF16_SECONDS:-150}

"$PYTHON" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device: this check needs a GPU")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
PY
if [ ! -f "$MODEL/llm.pt" ]; then
    "$PYTHON" -m scripts.make_tiny_cosyvoice "$MODEL" --full
fi
status=0
timeout "$CHECK_SECONDS" "$PYTHON" -m bench.cosyvoice "$MODEL" --device cuda --repeat 1 \
    --streams 1 4 8 16 --no-flow-table --llm-steps dynamic graph --name cosyvoice-gpu || status=$?
timeout "$BF16_SECONDS" "$PYTHON" -m bench.cosyvoice "$MODEL" --device cuda --repeat 1 \
    --streams 1 16 --no-flow-table --llm-steps graph --precision bfloat16 \
    --name cosyvoice-gpu-bf16 || status=$?
exit "$status"
