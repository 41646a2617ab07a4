#!/usr/bin/env bash
# The GPU figures of the moshi step (docs/benchmarks/duplex-model.md), on a
# lent machine with torch: the wheels of build/gpu-wheels/ (this project's
# transformers and the server's dependencies, carried) installed into
# /tmp/site first. `scripts/moshi-gpu-bench.sh step`: the fast-vs-eager and
# static-vs-eager codec checks on the tiny model, the Mimi tests (their CUDA
# graph test included), the codec alone at the real size, then the random 7B
# at a 3000-frame context: tick and codec share with the graphed and the
# eager codec, a long call across the window, a resume's rebuild.
# `scripts/moshi-gpu-bench.sh server`: `bench duplex-model` through a serve
# process at SESSIONS sessions on a saved random 7B checkpoint.
set -uo pipefail
WHEELS=${WHEELS:-build/gpu-wheels}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
# duplex_server.metrics reads its own version from the package metadata; the
# checkout is not installed there, so give it a dist-info of its own
mkdir -p /tmp/site/duplex_server-0.0.0.dist-info
printf 'Metadata-Version: 2.1\nName: duplex-server\nVersion: 0.0.0\n' \
  >/tmp/site/duplex_server-0.0.0.dist-info/METADATA
export PYTHONPATH=/tmp/site:$PWD
# transformers 5.25 asks for its hub kernels package at load unless told not to;
# the lent machine has neither it nor a network to fetch them
export USE_HUB_KERNELS=0
# each part's output also goes to its own file in $OUT as it is printed (a
# part cut short by the run's time limit still leaves what it printed)
LOG=${OUT:-/tmp}
keep() { grep --line-buffered -v 'Loading weights\|Writing model' | tee -a "$LOG/$1.txt"; }
python3 -c "import transformers, torch; print('torch', torch.__version__, 'transformers', transformers.__version__)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
date -u
step() {
  # STEP_ONLY=1: the 7B part alone (no tiny-model checks, no Mimi profile)
  [ -z "${STEP_ONLY:-}" ] && {
  timeout 120 python3 scripts/moshi_fast_check.py --device cuda --dtype float32 \
    --temperature 0.8 2>&1 | keep checks
  [ -n "${QUICK:-}" ] || timeout 120 python3 scripts/moshi_fast_check.py --device cuda \
    --dtype bfloat16 --temperature 0.8 2>&1 | keep checks
  timeout 150 python3 -m pytest -p no:cacheprovider --noconftest -q -rs tests/test_mimi_graph.py \
    2>&1 | tail -3 | keep checks
  timeout 120 python3 scripts/moshi_mimi_profile.py --rows 1 ${ROWS:-32 48 64} 2>&1 | keep codec
  }
  # each codec in its own process: in one process the graphed run's KV ring
  # was still held when the eager one was built (the eager-codec run at 32
  # rows, context 3,000, ran out of memory on an H100 with 16 GiB free)
  cat >/tmp/moshi_step.py <<'PY'
import json, sys
from duplex_server.engine.duplex import bench_step as b

model = b.random_7b("cuda", "bfloat16")
def show(**figures):
    print(json.dumps({"device": "cuda", "dtype": "bfloat16", **figures}), flush=True)
rows = {"graphed": sys.argv[1].split(), "eager": sys.argv[3].split()}
for codec in ("graphed", "eager"):
    for n in rows[codec]:
        show(step="fast", codec=codec, **b._one(model, "fast", codec, int(n), 60, 3000, 0.8, 0))
# a long call: 32 rows from 2,500 frames of context on, through the window's fill at 3,000
long = int(sys.argv[2])  # LONG_FRAMES=0: none
if long > 0:
    show(step="fast", codec="graphed", **b._one(model, "fast", "graphed", 32, long, 2500, 0.8, 250))
for frames in sys.argv[4].split():  # a resume's rebuild (the chunked prefill), one row
    show(**b._rebuild(model, int(frames)))
PY
  timeout 300 python3 -u /tmp/moshi_step.py "${ROWS:-32 48 64}" "${LONG_FRAMES:-1500}" " " \
    "${REBUILDS:-3000 7500}" 2>&1 | keep step
  eager=${EAGER_ROWS:-${ROWS:-32 48 64}}
  [ -z "${eager// /}" ] || timeout 200 python3 -u /tmp/moshi_step.py " " 0 "$eager" " " \
    2>&1 | keep step
}
server() {
  timeout 200 python3 -c "
from duplex_server.engine.duplex.bench_step import random_7b
random_7b('cuda', 'bfloat16').save_pretrained('/tmp/moshi-7b')" 2>&1 | tail -2 | keep server
  du -sh /tmp/moshi-7b | keep server
  date -u | keep server
  timeout 480 python3 -m duplex_server.cli bench duplex-model --model /tmp/moshi-7b \
    --sessions "${SESSIONS:-64}" --frames "${FRAMES:-200}" --moshi-step fast --device cuda \
    --dtype bfloat16 2>&1 | tail -5 | keep server
}
case "${1:-step}" in
step) step ;;
# the tiny model's checks alone, any moshi_fast_check.py flags after it
checks) shift; timeout 120 python3 scripts/moshi_fast_check.py "$@" 2>&1 | keep checks ;;
server) server ;;
all) step; date -u; server ;;
esac
date -u
