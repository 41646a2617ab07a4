#!/usr/bin/env bash
# The GPU figures of the moshi step (docs/benchmarks/duplex-model.md): on a machine with
# torch and transformers, the project's small pure-Python dependencies
# installed from .gpu-wheels/ if missing. Fast vs eager greedy tokens on the
# tiny model, then tick times of the random 7B at a 3000-frame context.
set -euo pipefail
python -c "import prometheus_client" 2>/dev/null || python -m pip install -q --no-deps .gpu-wheels/prometheus_client-*.whl
# the transformers this project pins (its Mimi modules), with the hub client it needs
python -c "import transformers as t; assert t.__version__ == '5.25.0'; import kernels" 2>/dev/null ||
  python -m pip install -q --no-deps .gpu-wheels/transformers-*.whl .gpu-wheels/huggingface_hub-*.whl \
    .gpu-wheels/hf_xet-*.whl .gpu-wheels/httpx2-*.whl .gpu-wheels/httpcore2-*.whl \
    .gpu-wheels/typer-*.whl .gpu-wheels/kernels-*.whl .gpu-wheels/shellingham-*.whl .gpu-wheels/truststore-*.whl
python -c "import transformers, torch; print('torch', torch.__version__, 'transformers', transformers.__version__)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONPATH=$PWD
python scripts/moshi_fast_check.py --device cuda --dtype float32
python scripts/moshi_fast_check.py --device cuda --dtype bfloat16
python -m duplex_server.engine.duplex.bench_step random-7b --device cuda --dtype bfloat16 \
  --context 3000 --frames "${FRAMES:-40}" --step fast --rows ${FAST_ROWS:-1 16 32 48 64 72} --stop-over-ms 400
python -m duplex_server.engine.duplex.bench_step random-7b --device cuda --dtype bfloat16 \
  --context 3000 --frames "${EAGER_FRAMES:-20}" --step eager --rows ${EAGER_ROWS:-1 8 16 32} --stop-over-ms 400
