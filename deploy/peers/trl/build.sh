#!/usr/bin/env bash
# Build (once) the venv that runs Hugging Face TRL, the peer baseline, on CPU for benchmarks.
#
#   deploy/peers/trl/build.sh              -> prints the venv's python path (last stdout line)
#   deploy/peers/trl/build.sh --print-hash -> prints the inputs' hash only (builds nothing)
#
# The venv lives outside the clone, at ${TEMPER_CACHE:-/var/cache/temper}/trl-peer-<hash16>,
# where the hash covers requirements.txt, this script and grpo_run.py: every clone of the same
# inputs reuses one build, and a changed input builds a new venv beside the old one.  A stamp
# file is written only after every step succeeded, so an interrupted build is redone, never
# used.  A second run with a built venv is a no-op that prints the path.  Modelled on
# deploy/sglang-cpu/build.sh; see README.md here.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
cache="${TEMPER_CACHE:-/var/cache/temper}"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python3

inputs_hash() {
  local f
  for f in requirements.txt build.sh grpo_run.py; do
    printf '%s\n' "$f"
    cat "$f"
  done | sha256sum | cut -c1-16
}

hash="$(inputs_hash)"
if [ "${1:-}" = "--print-hash" ]; then
  printf '%s\n' "$hash"
  exit 0
fi
venv="$cache/trl-peer-$hash"
stamp="$venv/.temper-build-complete"
pointer="$cache/trl-peer.current"

publish() {
  # The pointer names the newest complete build, for code that runs outside this clone.
  if [ "$(cat "$pointer" 2>/dev/null)" != "$venv/bin/python" ]; then
    printf '%s\n' "$venv/bin/python" >"$pointer.tmp.$$" && mv "$pointer.tmp.$$" "$pointer"
  fi
  printf '%s\n' "$venv/bin/python"
}

if [ -f "$stamp" ]; then
  publish
  exit 0
fi

mkdir -p "$cache"
# One builder at a time per hash (two benchmark runs may start together).
exec 9>"$cache/trl-peer-$hash.lock"
flock 9
if [ -f "$stamp" ]; then
  publish
  exit 0
fi

torch_req="$(grep -E '^torch==' requirements.txt | head -1)"
constraints="$(mktemp)"
runtime_reqs="$(mktemp)"
trap 'rm -f "$constraints" "$runtime_reqs"' EXIT
printf '%s\n' "$torch_req" >"$constraints"
grep -v -E '^(#|torch==|[[:space:]]*$)' requirements.txt >"$runtime_reqs"

echo "trl-peer: building $venv (about 1 minute and 1.5 GB)" >&2
rm -rf "$venv"
"$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first, alone: resolved by itself it is the CPU wheel; pulled in as a dependency of
# trl or accelerate it could be a multi-GB CUDA build.
"${pip[@]}" "$torch_req" >&2
# The rest with normal resolution (so pip checks the pins agree), but the constraint holds
# torch where it is: nothing can replace it or add CUDA libraries.
"${pip[@]}" -c "$constraints" -r "$runtime_reqs" >&2

# Prove the result before stamping it: a CPU torch of the pinned release, TRL's GRPO
# importable, and the runner at least compiles under this interpreter.
"$venv/bin/python" - >&2 <<'EOF'
import torch
import trl
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
assert torch.__version__.startswith("2.13"), f"expected torch 2.13, got {torch.__version__}"
assert torch.version.cuda is None, f"expected the CPU torch, got CUDA {torch.version.cuda}"
print(f"trl-peer: trl {trl.__version__} on torch {torch.__version__} imports")
EOF
# compile() rather than py_compile: nothing written into the clone.
"$venv/bin/python" -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' grpo_run.py

touch "$stamp"
# Keep the newest other build (a branch switch back is free); drop older ones.
for old in $(ls -dt "$cache"/trl-peer-???????????????? 2>/dev/null | grep -v -x "$venv" | tail -n +2 || true); do
  echo "trl-peer: removing old build $old" >&2
  rm -rf "$old" "$old.lock"
done
publish
