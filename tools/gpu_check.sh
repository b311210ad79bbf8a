#!/usr/bin/env bash
# The whole GPU check of distrib on a fresh GPU machine, in at most 9 minutes, from any directory:
#
#     tools/gpu_check.sh [LOGDIR]        # default: gpu_logs/<UTC time> in the repository
#
# Needs python3 (or python; PYTHON=... to choose) with torch built with CUDA, and pytest; fastcore (and tqdm, where
# the machine lacks it) come from wheels carried in .whl/ (on a machine with a package registry:
# `pip download --no-deps fastcore==1.14.5 tqdm -d .whl`; and numpy's, where torch came without it: torch's object
# collectives need it, `pip download --no-deps --only-binary=:all: --python-version 3.12 numpy -d .whl`): nothing is
# downloaded (the Development page, nbs/90_development.ipynb, "On GPUs"). Then:
#   1. env:      the machine (nvidia-smi, python, torch and CUDA versions, GPUs), and what compile=True's checks
#                need (a C compiler, Python.h, triton on CUDA): a missing one is named in the summary before they run;
#   2. install:  the carried wheels into a fresh folder, LOGDIR/site (pip --target --no-index --no-deps; unzipped
#                where there is no pip), put first on PYTHONPATH with the repository: no package is installed;
#   3. suite:    python3 -m pytest -m gpu tests (two-GPU checks skipped, with the reason, on one GPU);
#   4. overhead: bench/overhead.py --device cuda (the Learner against a hand-written DDP loop; one GPU or more);
#   5. strategies: bench/strategies.py --device cuda, DDP against FSDP (two GPUs or more; skipped on one).
# Each step writes LOGDIR/<step>.log and has a time limit (together 9 minutes); LOGDIR/summary.txt has a line per step
# (exit code, seconds), the suite's counts (passed, failed, skipped) and each benchmark's headline figures. Exit code:
# 0 when every step passed, else the first failing step's.
# DISTRIB_TEST_DEVICE=cpu tools/gpu_check.sh rehearses it on a CPU machine, by the same install path (the carried
# wheels into a fresh folder): the suite's CPU part (as CI runs it), the benchmarks with their smallest settings.
set -u
cd "$(dirname "$0")/.." || exit 1
LOG=${1:-gpu_logs/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$LOG" && LOG=$(cd "$LOG" && pwd) || exit 1
PY=${PYTHON:-$(command -v python3 || command -v python)}
[ -n "$PY" ] || { echo "no python3 (nor python) on PATH: set PYTHON=/path/to/python"; exit 1; }
SITE="$LOG/site"   # the carried wheels, installed fresh at every run
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
: > "$LOG/summary.txt"
status=0
note() { echo "$*" | tee -a "$LOG/summary.txt"; }

step() {   # step NAME SECONDS COMMAND...: run COMMAND with a time limit, its output in LOG/NAME.log
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc
    note "== $name (at most ${limit}s): $*"
    timeout -k 10 "$limit" "$@" > "$LOG/$name.log" 2>&1; rc=$?
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && note "   timed out after ${limit}s"
    note "   $name: exit code $rc, $((SECONDS - t0))s"
    tail -n 3 "$LOG/$name.log" | sed 's/^/   | /'
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
    return $rc
}

DEV=${DISTRIB_TEST_DEVICE:-cuda}   # DISTRIB_TEST_DEVICE=cpu rehearses the whole check on a CPU machine (small benchmarks)
export PY DEV SITE
envinfo() {
    nvidia-smi || echo "(no nvidia-smi)"
    "$PY" - <<'PYEOF'
import os, shutil, sys, sysconfig, importlib.util
print(sys.executable, sys.version)
import torch
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
for i in range(torch.cuda.device_count()): print(f'cuda:{i}', torch.cuda.get_device_name(i))
if torch.cuda.is_available(): print('nccl', torch.cuda.nccl.version())
import pytest; print('pytest', pytest.__version__)
# torch's object collectives (all_gather_object, broadcast_object_list, which distrib uses) read bytes by numpy
if importlib.util.find_spec('numpy') is None and not any('numpy' in w for w in (os.listdir('.whl') if os.path.isdir('.whl') else []) if w.endswith('.whl')):
    print('MISSING numpy: torch.distributed\'s object collectives need it; carry its wheel in .whl/')
# compile=True's checks (tests share_compile, test_compile): Inductor builds C code (a C/C++ compiler and Python.h),
# and on CUDA its kernels are Triton's
cc = os.environ.get('CC') or next((shutil.which(c) for c in ('cc', 'gcc', 'clang') if shutil.which(c)), None)
cxx = os.environ.get('CXX') or next((shutil.which(c) for c in ('c++', 'g++', 'clang++') if shutil.which(c)), None)
h = os.path.join(sysconfig.get_paths()['include'], 'Python.h')
need = {'a C compiler (cc, gcc or clang)': cc, 'a C++ compiler (c++, g++ or clang++)': cxx,
        f'Python.h ({h})': os.path.exists(h)}
if os.environ['DEV'] != 'cpu': need['triton'] = importlib.util.find_spec('triton') is not None
print('compile=True needs:', {k: v or False for k, v in need.items()})
missing = [k for k, v in need.items() if not v]
with open(os.path.join(os.environ['LOG'], 'compile_missing.txt'), 'w') as f: f.write(', '.join(missing))
assert torch.cuda.is_available() or os.environ['DEV'] == 'cpu', 'torch sees no GPU (torch.cuda.is_available() is False)'
PYEOF
}
install() {   # the carried wheels into a fresh $SITE: pip's own path (--target, --no-index --no-deps), or unzipped
    rm -rf "$SITE"; mkdir -p "$SITE"
    ls .whl/*.whl > /dev/null 2>&1 || { echo "(no wheels carried in .whl/)"; return 0; }
    if "$PY" -m pip --version > /dev/null 2>&1; then
        "$PY" -m pip install --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
    else
        echo "(no pip: the wheels are unzipped into $SITE, which is what pip does for pure-python wheels)"
        for w in .whl/*.whl; do "$PY" -m zipfile -e "$w" "$SITE" || return 1; done
    fi
}
export LOG
export -f envinfo install

step env 120 bash -c envinfo || { note "no GPU or no python with torch and pytest: stopped (see $LOG/env.log)"; exit $status; }
missing=$(cat "$LOG/compile_missing.txt" 2> /dev/null)
[ -n "$missing" ] && note "   compile=True's checks (share_compile, test_compile) need what is missing here: $missing;" \
                          "they will fail (install it: apt-get install gcc python3-dev)"
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
step install 60 bash -c install
"$PY" -c 'import distrib, fastcore, tqdm, numpy; print("distrib from", distrib.__file__, "| fastcore", fastcore.__version__,
"from", fastcore.__file__, "| tqdm", tqdm.__version__)' >> "$LOG/install.log" 2>&1 || {
    note "distrib, fastcore, tqdm or numpy does not import (see $LOG/install.log): carry their wheels in .whl/"
    exit 1; }
tail -n 1 "$LOG/install.log" | sed 's/^/   /' | tee -a "$LOG/summary.txt"

counts() {   # the suite's counts, from pytest's last line
    local c; c=$(tail -n 5 "$LOG/suite.log" | grep -oE '[0-9]+ (passed|failed|skipped|errors?|xfailed|xpassed|deselected)' \
                 | paste -sd, - | sed 's/,/, /g')
    note "   suite: ${c:-no counts (see suite.log)}"
}
headlines() {   # each benchmark's headline figures: overhead's comparisons (B/A, target, ok), strategies' rows
    [ -f "$LOG/overhead.log" ] && grep -E ' (ok|MISSED)$' "$LOG/overhead.log" | sed 's/^/   overhead: /' | tee -a "$LOG/summary.txt"
    [ -f "$LOG/strategies.log" ] && grep -E '^ *(ddp|fsdp[a-z_0-9]*) +[0-9]' "$LOG/strategies.log" \
        | sed 's/^ */   strategies: /' | tee -a "$LOG/summary.txt"
    return 0
}

if [ "$DEV" = cpu ]; then   # the rehearsal: the suite's CPU part, the benchmarks' smallest settings
    step suite 300 "$PY" -m pytest -m gpu tests -v -rs -p no:cacheprovider --durations=15; counts
    step overhead 90 "$PY" bench/overhead.py --sections ddp --reps 3
    step strategies 90 "$PY" bench/strategies.py --hidden 64 --layers 2 --steps 2 --warmup 1 --batch 2 --configs ddp,fsdp --timeout 60
    headlines
    note "logs in $LOG; exit code $status (a rehearsal on CPU: DISTRIB_TEST_DEVICE=cpu)"
    exit $status
fi
step suite 240 "$PY" -m pytest -m gpu tests -v -rs -p no:cacheprovider --durations=15; counts
step overhead 70 "$PY" bench/overhead.py --device cuda --reps 3
if [ "$NGPU" -ge 2 ]; then
    step strategies 70 "$PY" bench/strategies.py --device cuda --configs ddp,fsdp --steps 10 --timeout 60
else
    note "== strategies: skipped, it needs two GPUs ($NGPU visible)"
fi
headlines
note "logs in $LOG; exit code $status"
exit $status
