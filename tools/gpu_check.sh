#!/usr/bin/env bash
# The whole GPU check of distrib on a fresh GPU machine, in at most 8 minutes, from any directory:
#
#     tools/gpu_check.sh [LOGDIR]        # default: gpu_logs/<UTC time> in the repository
#
# Needs python with torch built with CUDA, and pytest; fastcore and tqdm come from wheels carried in .whl/ (on a
# machine with a package registry: `pip download --no-deps fastcore==1.14.5 tqdm -d .whl`), installed with
# --no-index --no-deps, as the Development page (nbs/90_development.ipynb, "On GPUs") says: nothing is downloaded.
# Then:
#   1. env:      the machine (nvidia-smi, torch and CUDA versions, GPUs, the C compilers compile=True needs);
#   2. install:  the carried wheels and this package (--no-deps; the repository is on PYTHONPATH as well);
#   3. suite:    python -m pytest -m gpu tests (two-GPU checks skipped, with the reason, on one GPU);
#   4. overhead: bench/overhead.py --device cuda (the Learner against a hand-written DDP loop; one GPU or more);
#   5. strategies: bench/strategies.py --device cuda, DDP against FSDP (two GPUs or more; skipped on one).
# Each step writes LOGDIR/<step>.log and has a time limit (together 8 minutes); LOGDIR/summary.txt has one line per
# step (exit code, seconds). Exit code: 0 when every step passed, else the first failing step's.
# DISTRIB_TEST_DEVICE=cpu tools/gpu_check.sh rehearses it on a CPU machine: the suite's CPU part (as CI runs it), the
# benchmarks with their smallest settings, the same logs; it installs nothing (the environment's packages are used).
set -u
cd "$(dirname "$0")/.." || exit 1
LOG=${1:-gpu_logs/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$LOG" || exit 1
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
: > "$LOG/summary.txt"
status=0

step() {   # step NAME SECONDS COMMAND...: run COMMAND with a time limit, its output in LOG/NAME.log
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc
    echo "== $name (at most ${limit}s): $*" | tee -a "$LOG/summary.txt"
    timeout -k 10 "$limit" "$@" > "$LOG/$name.log" 2>&1; rc=$?
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "   timed out after ${limit}s" | tee -a "$LOG/summary.txt"
    echo "   $name: exit code $rc, $((SECONDS - t0))s" | tee -a "$LOG/summary.txt"
    tail -n 3 "$LOG/$name.log" | sed 's/^/   | /'
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
    return $rc
}

DEV=${DISTRIB_TEST_DEVICE:-cuda}   # DISTRIB_TEST_DEVICE=cpu rehearses the whole check on a CPU machine (small benchmarks)
export PY DEV
envinfo() {
    nvidia-smi || echo "(no nvidia-smi)"
    $PY - <<'PYEOF'
import os, shutil, sys, torch
print(sys.version)
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
for i in range(torch.cuda.device_count()): print(f'cuda:{i}', torch.cuda.get_device_name(i))
if torch.cuda.is_available(): print('nccl', torch.cuda.nccl.version())
print({k: os.environ.get(k) or shutil.which(k.lower()) for k in ('CC', 'GCC', 'CLANG', 'CXX')})   # compile=True's
import pytest; print('pytest', pytest.__version__)
assert torch.cuda.is_available() or os.environ['DEV'] == 'cpu', 'torch sees no GPU (torch.cuda.is_available() is False)'
PYEOF
}
install() {   # pip failing (say an externally managed python) is not fatal: the imports decide, below
    if [ "$DEV" = cpu ]; then echo "(a rehearsal: nothing installed)"; return; fi
    if ls .whl/*.whl > /dev/null 2>&1; then $PY -m pip install --no-index --no-deps .whl/*.whl || echo "(pip failed)"; fi
    $PY -m pip install --no-index --no-deps --no-build-isolation -e . \
        || echo "(pip could not install the package: it runs from PYTHONPATH=$PWD)"
}
export -f envinfo install

step env 15 bash -c envinfo || { echo "no GPU or no python with torch and pytest: stopped (see $LOG/env.log)"; exit $status; }
NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())')
step install 35 bash -c install
if ! $PY -c 'import fastcore, tqdm' 2> /dev/null; then   # pure-python wheels import from the archive itself
    for w in .whl/*.whl; do [ -e "$w" ] && PYTHONPATH="$PWD/$w:$PYTHONPATH"; done; export PYTHONPATH
fi
$PY -c 'import distrib, fastcore, tqdm; print("distrib from", distrib.__file__)' >> "$LOG/install.log" 2>&1 || {
    echo "distrib, fastcore or tqdm does not import (see $LOG/install.log): carry fastcore's and tqdm's wheels in .whl/"
    exit 1; }

if [ "$DEV" = cpu ]; then   # the rehearsal: the suite's CPU part, the benchmarks' smallest settings
    step suite 240 $PY -m pytest -m gpu tests -v -rs -p no:cacheprovider --durations=15
    step overhead 70 $PY bench/overhead.py --sections ddp --reps 3
    step strategies 70 $PY bench/strategies.py --hidden 64 --layers 2 --steps 2 --warmup 1 --batch 2 --configs ddp,fsdp --timeout 60
    echo "logs in $LOG; exit code $status (a rehearsal on CPU: DISTRIB_TEST_DEVICE=cpu)" | tee -a "$LOG/summary.txt"
    exit $status
fi
step suite 240 $PY -m pytest -m gpu tests -v -rs -p no:cacheprovider --durations=15
step overhead 70 $PY bench/overhead.py --device cuda --reps 3
if [ "$NGPU" -ge 2 ]; then
    step strategies 70 $PY bench/strategies.py --device cuda --configs ddp,fsdp --steps 10 --timeout 60
else
    echo "== strategies: skipped, it needs two GPUs ($NGPU visible)" | tee -a "$LOG/summary.txt"
fi
echo "logs in $LOG; exit code $status" | tee -a "$LOG/summary.txt"
exit $status
