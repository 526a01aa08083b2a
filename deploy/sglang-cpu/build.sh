#!/usr/bin/env bash
# Build (once) the venv that runs a real SGLang server on CPU for tests and benchmarks.
#
#   deploy/sglang-cpu/build.sh              -> prints the venv's python path (last stdout line)
#   deploy/sglang-cpu/build.sh --print-hash -> prints the inputs' hash only (builds nothing)
#
# The venv lives outside the clone, at ${TEMPER_CACHE:-/var/cache/temper}/sglang-cpu-<hash16>,
# where the hash covers requirements.txt, the shims and this script: CI and every clone of
# the same inputs reuse one build, and a changed input builds a new venv beside the old one.
# A stamp file is written only after every step succeeded, so an interrupted build is
# redone, never used.  A second run with a built venv is a no-op that prints the path.
# The hash recipe is mirrored by services/generator/sglang_server.py (venv_hash); keep
# them in step.  See README.md here for the shims and why each pip step looks as it does.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
cache="${TEMPER_CACHE:-/var/cache/temper}"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python3

inputs_hash() {
  local f
  for f in requirements.txt build.sh $(find shims -type f -name '*.py' | LC_ALL=C sort); do
    printf '%s\n' "$f"
    cat "$f"
  done | sha256sum | cut -c1-16
}

hash="$(inputs_hash)"
if [ "${1:-}" = "--print-hash" ]; then
  printf '%s\n' "$hash"
  exit 0
fi
venv="$cache/sglang-cpu-$hash"
stamp="$venv/.temper-build-complete"
pointer="$cache/sglang-cpu.current"

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
# One builder at a time per hash (a test session and `make bench` may start together).
exec 9>"$cache/sglang-cpu-$hash.lock"
flock 9
if [ -f "$stamp" ]; then
  publish
  exit 0
fi

requirement() { grep -E "^$1==" requirements.txt | head -1; }
torch_req="$(requirement torch)"
sglang_req="$(requirement sglang)"
runtime_reqs="$(mktemp)"
trap 'rm -f "$runtime_reqs"' EXIT
grep -v -E '^(#|torch==|sglang==|[[:space:]]*$)' requirements.txt >"$runtime_reqs"

echo "sglang-cpu: building $venv (about 3 minutes and 2.7 GB)" >&2
rm -rf "$venv"
"$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first, alone: resolved by itself it is the CPU wheel; pulled in as a dependency of
# sglang it would be a multi-GB CUDA build.
"${pip[@]}" "$torch_req" >&2
# sglang and every runtime dependency without dependency resolution, so nothing can
# replace torch or add GPU-only packages (sgl-kernel, flashinfer, CUDA libraries).
"${pip[@]}" --no-deps "$sglang_req" >&2
"${pip[@]}" --no-deps -r "$runtime_reqs" >&2

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for shim in shims/*/; do
  rm -rf "$site/$(basename "$shim")"
  cp -r "$shim" "$site/"
done

# Prove the result before stamping it: a CPU torch, and SGLang importable with the shims.
SGLANG_USE_CPU_ENGINE=1 "$venv/bin/python" - >&2 <<'EOF'
import torch
assert torch.version.cuda is None, f"expected the CPU torch, got CUDA {torch.version.cuda}"
import sglang.srt.entrypoints.http_server  # noqa: F401  (imports the scheduler's modules too)
import sglang
print(f"sglang-cpu: sglang {sglang.__version__} on torch {torch.__version__} imports")
EOF

touch "$stamp"
# Keep the newest other build (a branch switch back is free); drop older ones: 2.7 GB each.
for old in $(ls -dt "$cache"/sglang-cpu-???????????????? 2>/dev/null | grep -v -x "$venv" | tail -n +2 || true); do
  echo "sglang-cpu: removing old build $old" >&2
  rm -rf "$old" "$old.lock"
done
publish
