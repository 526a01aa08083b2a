#!/usr/bin/env bash
# Temper on one GPU machine that has torch and transformers but no network, in one go:
#   1. installs the project from a folder of wheels (pip --no-index; torch and transformers
#      stay as they are: pinned to the installed versions);
#   2. runs bench/gpu_check.py: the torch engine against Hugging Face generate, a learner
#      step against a bare torch step, weight publication against a bare save and load,
#      then a 5-minute `temper train`; each part time-boxed, the whole within 10 minutes.
# Without CUDA it runs the CPU fallback (float32, a smaller model, shorter boxes).
#
# Usage:
#   deploy/gpu/check.sh [--wheels DIR] [--python PY] [--no-install] [--limit S] [CHECK OPTIONS]
#   deploy/gpu/check.sh --fetch-wheels [--wheels DIR] [--python PY] [-- PIP OPTIONS]
#
#   --wheels DIR     the folder of wheels (env TEMPER_WHEELS; default deploy/gpu/wheels)
#   --python PY      the Python that has torch and transformers (env TEMPER_PYTHON; default
#                    python3)
#   --no-install     the project is installed already: skip step 1
#   --limit S        the whole run's bound in seconds, install included (default 600)
#   --fetch-wheels   on a machine with network: fill the folder with wheels of the
#                    project's dependencies (not torch, not transformers) and stop.  Run it
#                    with the GPU machine's Python version on its platform (the same image,
#                    with network); PIP OPTIONS after -- go to `pip wheel`.  For another
#                    platform see docs/operations.md ("GPU check": pip download).
#   CHECK OPTIONS    passed to bench/gpu_check.py: --quick, --device cpu|cuda, --layers N,
#                    --hidden N, --seconds S, --train-minutes M, --sections LIST, --out DIR
#                    (see `python bench/gpu_check.py --help`).
#
# Exit status: 0 every section measured; 1 a section failed; 2 bad usage or a missing
# wheel folder; 3 a prerequisite is missing (pip, torch, transformers); 124 the limit.
set -euo pipefail

readonly EXIT_USAGE=2
readonly EXIT_PREREQ=3
#: Editable installs without build isolation need setuptools' own bdist_wheel (70.1+).
readonly SETUPTOOLS='setuptools>=70.1'

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
started=$SECONDS

log() { printf 'gpu check: %s\n' "$*" >&2; }
die() { local code=$1; shift; log "error: $*"; exit "$code"; }

wheels="${TEMPER_WHEELS:-$here/wheels}"
python="${TEMPER_PYTHON:-python3}"
install=1
fetch=0
limit=600
check_args=()
pip_args=()

while (($#)); do
  case "$1" in
    --wheels) (($# >= 2)) || die $EXIT_USAGE "--wheels needs a folder"; wheels="$2"; shift 2 ;;
    --python) (($# >= 2)) || die $EXIT_USAGE "--python needs a command"; python="$2"; shift 2 ;;
    --no-install) install=0; shift ;;
    --fetch-wheels) fetch=1; shift ;;
    --limit)
      [[ ${2:-} =~ ^[0-9]+$ ]] || die $EXIT_USAGE "--limit needs whole seconds, not '${2:-}'"
      limit="$2"; shift 2 ;;
    --) shift; pip_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) check_args+=("$1"); shift ;;
  esac
done

command -v "$python" >/dev/null 2>&1 || die $EXIT_PREREQ "no Python '$python' (--python)"

# The project's dependencies, from pyproject.toml, without torch and transformers: the GPU
# machine has its own builds of those (CUDA wheels), which nothing here may replace.
dependencies() {
  "$python" - "$repo/pyproject.toml" <<'EOF'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
for dep in deps:
    name = re.match(r"[A-Za-z0-9._-]+", dep).group(0).lower()
    if name not in ("torch", "transformers"):
        print(dep)
EOF
}

fetch_wheels() {
  mkdir -p "$wheels"
  local requirements
  mapfile -t requirements < <(dependencies)
  log "building wheels of ${#requirements[@]} dependencies (and theirs) into $wheels"
  # pip wheel, not pip download: a dependency published only as a source archive is
  # built here, so the offline machine installs wheels alone.
  "$python" -m pip wheel --wheel-dir "$wheels" "$SETUPTOOLS" "${requirements[@]}" \
    ${pip_args[@]+"${pip_args[@]}"}
  log "done: copy $wheels to the GPU machine (deploy/gpu/wheels there, or --wheels DIR)"
}

install_project() {
  [[ -d $wheels ]] || die $EXIT_USAGE "wheel folder $wheels does not exist; fill it on a \
machine with network: deploy/gpu/check.sh --fetch-wheels --wheels $wheels"
  "$python" -m pip --version >/dev/null 2>&1 || die $EXIT_PREREQ "$python has no pip"
  local pins
  pins="$(mktemp)"
  trap 'rm -f "$pins"' EXIT
  # Pin torch and transformers to what is installed: pip keeps them, or says which
  # requirement of the project they miss (never fetches others).
  "$python" - >"$pins" <<'EOF' || die $EXIT_PREREQ "$python lacks torch or transformers"
from importlib.metadata import PackageNotFoundError, version
import sys
try:
    for name in ("torch", "transformers"):
        print(f"{name}=={version(name)}")
except PackageNotFoundError as missing:
    sys.exit(f"not installed: {missing}")
EOF
  log "installing the project from $wheels ($(tr '\n' ' ' <"$pins")kept)"
  if ! "$python" -c "import setuptools, sys
v = tuple(int(x) for x in setuptools.__version__.split('.')[:2])
sys.exit(v < (70, 1))" 2>/dev/null; then
    "$python" -m pip install --no-index --find-links "$wheels" "$SETUPTOOLS"
  fi
  "$python" -m pip install --no-index --find-links "$wheels" --no-build-isolation \
    --constraint "$pins" --editable "$repo"
  rm -f "$pins"
  trap - EXIT
}

if ((fetch)); then
  fetch_wheels
  exit 0
fi
if ((install)); then
  install_project
fi

left=$((limit - (SECONDS - started)))
((left > 60)) || die 124 "only ${left}s left of --limit ${limit}s after the install"
cd "$repo"
# The check keeps its own deadline (--total-seconds); the timeout is the backstop.
exec timeout --signal=INT --kill-after=30 "$left" \
  "$python" bench/gpu_check.py --total-seconds "$((left - 20))" \
  ${check_args[@]+"${check_args[@]}"}
