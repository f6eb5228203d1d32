#!/usr/bin/env bash
# The GPU path on a one-GPU machine without network (docs/gpu-runs.md says which wheels go
# in .whl): run from the repository root; everything lands under $OUT, and
# tools/gpu/runs_table.py "$OUT" prints docs/gpu-runs.md's table of it.
# Each step has its own time limit and the script goes on past a failed step.
# Rehearsed on a machine without CUDA (the kit's tests do, SKIP_INSTALL=1 PYTHON=...): the
# CUDA-only steps say they were skipped, and the suite runs on gloo with 2 ranks.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT/r"
PY=${PYTHON:-python3}
[ -n "${SKIP_INSTALL:-}" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/log.txt"
step() { # step NAME SECONDS CMD...: timed, its output in the log, its status on one line
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "=== $name: $*" >>"$log"
    timeout -s INT -k 15 "$limit" "$@" >>"$log" 2>&1
    echo "STEP $name rc=$? wall $((SECONDS - t0))s" | tee -a "$OUT/steps.txt" >>"$log"
}
skipped() { # skipped NAME WHY: a step this machine cannot run, said as such
    echo "STEP $1 skipped: $2" | tee -a "$OUT/steps.txt" >>"$log"
}
cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$cuda" = 1 ]; then
    nvidia-smi >"$OUT/env.txt" 2>&1
    DEFAULT_ARGS="--backend nccl --nproc 1 --min-gpus 1"
else
    echo "no CUDA: a rehearsal on gloo" >"$OUT/env.txt"
    DEFAULT_ARGS="--backend gloo --nproc 2"
fi
"$PY" -c "import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)" >>"$OUT/env.txt" 2>&1
nproc >>"$OUT/env.txt"
"$PY" -c "import thunder, litgpt, pytest, xdist, hypothesis; print('thunder', thunder.__version__, 'pytest', pytest.__version__)" >>"$OUT/env.txt" 2>&1
K="$PY -m pytest conformance -p no:cacheprovider --probe-cache=none ${KIT_ARGS:-$DEFAULT_ARGS}"
if [ "$cuda" = 1 ]; then
    step tp_probe 120 "$PY" -m torch.distributed.run --nproc-per-node 1 tools/gpu/tp_probe.py
    [ -n "${SKIP_SHARED:-}" ] || step shared_gpu 45 "$PY" -m torch.distributed.run --nproc-per-node 2 tools/gpu/nccl_shared_gpu_probe.py
else
    skipped tp_probe "no CUDA (Thunder's tensor parallel pins itself to CUDA)"
    skipped shared_gpu "no CUDA"
fi
step smoke 150 $K --profile smoke --report-dir "$OUT/r/smoke"
# planted bugs on the smoke cells, each its own world of one rank on the same GPU, in parallel
for bug in ${PLANTED:-originals_kept intermediates_not_freed backward_hook_not_called policy_offloads_nothing}; do
    CONFORMANCE_PLANTED_BUG=$bug step "planted_$bug" 200 $K -p tests.support.plant_plugin --profile smoke --report-dir "$OUT/r/planted_$bug" &
done
# CI_ARGS: more pytest arguments for the ci step (the rehearsal's: one cell, the smoke step has run them all)
step ci "${CI_LIMIT:-240}" $K --profile "${CI_PROFILE:-ci}" --report-dir "$OUT/r/ci" ${CI_ARGS:-}
wait
tar -C "$OUT/r" -czf "$OUT/reports.tgz" . && rm -rf "$OUT/r"
