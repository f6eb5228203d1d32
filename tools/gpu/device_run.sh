#!/usr/bin/env bash
# The GPU path on a one-GPU machine without network (docs/gpu-runs.md says which wheels go
# in .whl): run from the repository root; everything lands under $OUT.
# Each step has its own time limit and the script goes on past a failed step.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT/r"
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
log="$OUT/log.txt"
step() { # step NAME SECONDS CMD...: timed, its output in the log, its status on one line
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "=== $name: $*" >>"$log"
    timeout -s INT -k 15 "$limit" "$@" >>"$log" 2>&1
    echo "STEP $name rc=$? wall $((SECONDS - t0))s" | tee -a "$OUT/steps.txt" >>"$log"
}
{ nvidia-smi; python3 -c "import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"; nproc; } >"$OUT/env.txt" 2>&1
python3 -c "import thunder, litgpt, pytest, xdist, hypothesis; print('thunder', thunder.__version__, 'pytest', pytest.__version__)" >>"$OUT/env.txt" 2>&1
K="python3 -m pytest conformance -p no:cacheprovider ${KIT_ARGS:---backend nccl --nproc 1 --min-gpus 1}"
step tp_probe 120 torchrun --nproc-per-node 1 tools/gpu/tp_probe.py
[ -n "${SKIP_SHARED:-}" ] || step shared_gpu 45 torchrun --nproc-per-node 2 tools/gpu/nccl_shared_gpu_probe.py
step smoke 150 $K --profile smoke --report-dir "$OUT/r/smoke"
# planted bugs on the smoke cells, each its own world of one rank on the same GPU, in parallel
for bug in ${PLANTED:-originals_kept intermediates_not_freed backward_hook_not_called policy_offloads_nothing}; do
    CONFORMANCE_PLANTED_BUG=$bug step "planted_$bug" 200 $K -p tests.support.plant_plugin --profile smoke --report-dir "$OUT/r/planted_$bug" &
done
step ci "${CI_LIMIT:-240}" $K --profile ci --report-dir "$OUT/r/ci"
wait
tar -C "$OUT/r" -czf "$OUT/reports.tgz" . && rm -rf "$OUT/r"
