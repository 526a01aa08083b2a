#!/usr/bin/env bash
# The project's venv (.venv), made from a cached copy of its dependencies.
#
#   deploy/venv/build.sh VENV TORCH_VERSION   -> VENV holds torch, the project's and the dev
#                                               dependencies, and this clone installed editable
#   deploy/venv/build.sh --print-hash TORCH_VERSION -> the inputs' hash only (builds nothing)
#
# Installing torch and the dependencies takes minutes, every clone the same. They are
# installed once, at ${TEMPER_CACHE:-/var/cache/temper}/venv-<hash16>, where the hash covers
# pyproject.toml, the torch version, the python version and this script; a clone's venv is a
# copy of that (hard links where the file system allows) with its scripts pointed at the
# clone, plus the project itself installed editable. A stamp is written only after every
# step succeeded, so an interrupted build is redone, never used.
set -euo pipefail

usage() { echo "usage: $0 [--print-hash] VENV TORCH_VERSION | --print-hash TORCH_VERSION" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python_bin="${PYTHON:-python3}"
cache="${TEMPER_CACHE:-/var/cache/temper}"

inputs_hash() {
  {
    cat "$repo/pyproject.toml" "$here/build.sh"
    printf 'torch %s\n' "$1"
    "$python_bin" -c 'import sys; print(sys.version)'
  } | sha256sum | cut -c1-16
}

if [ "${1:-}" = "--print-hash" ]; then
  [ $# -eq 2 ] || usage
  inputs_hash "$2"
  exit 0
fi
[ $# -eq 2 ] || usage
venv="$1"
torch_version="$2"
hash="$(inputs_hash "$torch_version")"
cached="$cache/venv-$hash"
stamp="$cached/.temper-build-complete"

build_cache() {
  rm -rf "$cached"
  "$python_bin" -m venv "$cached"
  "$cached/bin/python" -m pip install --quiet --upgrade pip
  # torch first: a plain `torch` requirement resolved by pip alone pulls a multi-GB CUDA build.
  "$cached/bin/python" -m pip install --quiet "torch==$torch_version"
  # The dependencies only: the project is installed into each clone's copy.
  "$cached/bin/python" -m pip install --quiet -e "$repo[dev]"
  "$cached/bin/python" -m pip uninstall --quiet --yes temper
  touch "$stamp"
}

if [ ! -f "$stamp" ]; then
  mkdir -p "$cache"
  # One builder at a time per hash (two clones may run `make` together).
  exec 9>"$cache/venv-$hash.lock"
  flock 9
  [ -f "$stamp" ] || build_cache
fi

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
cp -al "$cached" "$venv" 2>/dev/null || { rm -rf "$venv"; cp -a "$cached" "$venv"; }
rm -f "$venv/.temper-build-complete"
# Scripts name their interpreter and activate scripts their venv by absolute path. sed -i
# writes a new file, so the cached copy behind a hard link is left as it was.
grep -rlI --null -- "$cached" "$venv/bin" | xargs -0 -r sed -i "s|$cached|$venv|g"
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$repo"
