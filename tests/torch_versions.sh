#!/usr/bin/env bash
# Run the whole test suite on another torch, as CI runs it (the README's test command: the notebooks, then pytest;
# then pytest's slow and bench sets), in a venv of its own outside the repository:
#
#     bash tests/torch_versions.sh 2.6.0                 # Python 3.11
#     bash tests/torch_versions.sh 2.15.0 python3.12     # another Python
#
# PyPI's torch for Linux is a CUDA build of several GB (it runs on CPU too); it is downloaded once per venv
# ($VENVS/torch<version>-py<python version>, default VENVS=../venvs beside the repository). CI does not run this: it
# uses the local CPU build of torch 2.13.0. This machine's pip may cap torch through a constraint file in its
# configuration: the installs here ignore pip's configuration files (PIP_CONFIG_FILE=/dev/null).
set -euo pipefail
version=${1:?usage: bash tests/torch_versions.sh TORCH_VERSION [PYTHON]}
python=${2:-python3.11}
cd "$(dirname "$0")/.."
root=$PWD
pyver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
venvs=${VENVS:-$root/../venvs}
venv=$venvs/torch$version-py$pyver
mkdir -p "$venvs"
if [ ! -x "$venv/bin/python" ]; then "$python" -m venv "$venv"; fi
. "$venv/bin/activate"
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q "torch==$version"
# The project and its dev tools, with the torch above kept: a constraint file pins it
echo "torch==$version" > "$venv/torch-pin.txt"
pip install -q -c "$venv/torch-pin.txt" -e ".[dev]"
python -c 'import sys, torch; print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")'
start=$(date +%s)
cmd=$(awk '/<!-- test-command/{f=1; next} f && /^```/{if (n++) exit; next} f' README.md)
tests=nbdev_test${cmd#*&& nbdev_test}
echo "running: $tests"
set +e
eval "$tests" && python -m pytest -q -n 2 -m slow tests && python -m pytest -q -m bench tests
code=$?
echo "torch $version, Python $pyver: exit code $code after $(( $(date +%s) - start )) s"
exit $code
