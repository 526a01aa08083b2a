#!/usr/bin/env bash
# Build the sandbox image without a registry:
#   debootstrap bookworm (minbase + packages.txt) -> tarball in a cache dir -> `docker import`
#   as temper-sandbox-base:<hash1> -> `docker build -f Dockerfile.offline` with the agent on top
#   as temper-sandbox:<hash2>, also tagged temper-sandbox:latest.
#
# hash1 covers this script and packages.txt; hash2 also covers Dockerfile.offline and every
# file of the agent package (names and contents).
# Every step is skipped when its output exists, so a second run takes seconds.
#
# Usage: build-offline.sh [--print-tag]
#   --print-tag   print the tag the current inputs would build, build nothing.
# The final image tag is the last line on stdout; everything else goes to stderr.
#
# Environment:
#   TEMPER_CACHE           where the root filesystem tarball is kept (default /var/cache/temper)
#   TEMPER_DEBIAN_MIRROR   Debian mirror URL (default: the host's apt configuration)
#
# Exit status: 0 built or present; 3 a prerequisite is missing (docker, debootstrap, root);
# anything else: the build failed.
set -euo pipefail

readonly SUITE=bookworm
readonly IMAGE=temper-sandbox
readonly BASE_IMAGE=temper-sandbox-base
readonly EXIT_PREREQ=3

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
script="$here/$(basename "${BASH_SOURCE[0]}")"
packages_file="$here/packages.txt"
dockerfile="$here/Dockerfile.offline"
agent_dir="$repo/services/sandbox/agent"
cache_dir="${TEMPER_CACHE:-/var/cache/temper}"

log() { printf 'build-offline: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
missing() { log "error: $*"; exit "$EXIT_PREREQ"; }

content_hash() { cat "$@" | sha256sum | cut -c1-16; }

# The agent package's source files, sorted, relative to its directory (bytecode caches left out).
agent_files() {
  (cd "$agent_dir" && find . -type f -name '*.py' ! -path '*/__pycache__/*' | LC_ALL=C sort)
}

# Each file's name and contents, so that a rename changes the hash too.
agent_hash() {
  local f
  agent_files | while read -r f; do
    printf '%s\0' "$f"
    cat "$agent_dir/$f"
  done | sha256sum | cut -c1-16
}

# Package names from packages.txt: comments and blank lines dropped, comma separated.
package_list() {
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "$packages_file" | grep -v '^$' | paste -sd, -
}

# The Debian mirror: $TEMPER_DEBIAN_MIRROR, else the host's apt sources (deb822, then one-line).
debian_mirror() {
  if [[ -n "${TEMPER_DEBIAN_MIRROR:-}" ]]; then
    printf '%s\n' "$TEMPER_DEBIAN_MIRROR"
    return
  fi
  local url="" f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r "$f" ]] || continue
    url="$(awk -v suite="$SUITE" 'BEGIN { RS = ""; FS = "\n" }
      { uris = ""; suites = ""; types = ""
        for (i = 1; i <= NF; i++) {
          line = $i
          if (line ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", line); uris = line }
          else if (line ~ /^Suites:/) { sub(/^Suites:/, "", line); suites = line " " }
          else if (line ~ /^Types:/) { sub(/^Types:/, "", line); types = line " " }
        }
        if (suites ~ ("[ \t]" suite " ") && types ~ /[ \t]deb / && uris != "") {
          split(uris, u, /[ \t]+/); print u[1]; exit
        } }' "$f")"
    [[ -n "$url" ]] && break
  done
  if [[ -z "$url" ]]; then
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -r "$f" ]] || continue
      url="$(awk -v suite="$SUITE" '$1 == "deb" {
          i = 2
          if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
          if ($(i + 1) == suite) { print $i; exit } }' "$f")"
      [[ -n "$url" ]] && break
    done
  fi
  [[ -n "$url" ]] || die "no '$SUITE' Debian mirror in the host's apt sources; set TEMPER_DEBIAN_MIRROR"
  printf '%s\n' "$url"
}

require_docker() {
  command -v docker >/dev/null 2>&1 || missing "docker is not installed"
  docker info >/dev/null 2>&1 || missing "the Docker engine does not answer ('docker info' failed)"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# Unmount anything debootstrap left mounted under $1, then remove it (never crossing mounts).
remove_rootfs() {
  local root="$1" mnt
  [[ -d "$root" ]] || return 0
  while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || true
  done < <(awk -v r="$root" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r)
  rm -rf --one-file-system "$root"
}

# Drop what a sandbox never needs: apt state, docs (copyright files kept), man pages,
# translations, logs, and the host files debootstrap copies in.
strip_rootfs() {
  local root="$1"
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
    "$root"/usr/share/lintian "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/*
  if [[ -d "$root/usr/share/doc" ]]; then
    find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  fi
  rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
  : >"$root/etc/machine-id"
}

build_rootfs_tar() {
  local tar="$1" packages mirror work
  [[ "$(id -u)" -eq 0 ]] || missing "debootstrap needs root (the rootfs tarball $tar is not cached)"
  command -v debootstrap >/dev/null 2>&1 || missing "debootstrap is not installed"
  packages="$(package_list)"
  mirror="$(debian_mirror)"
  work="$(mktemp -d "$cache_dir/rootfs-build.XXXXXX")"
  # shellcheck disable=SC2064  # expand now: the trap must remove this very directory
  trap "remove_rootfs '$work/root'; rm -rf '$work'" EXIT
  log "debootstrap $SUITE (minbase + $packages) from $mirror; takes a few minutes"
  if ! debootstrap --variant=minbase --components=main --include="$packages" \
      "$SUITE" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 40 "$work/debootstrap.log" >&2 || true
    die "debootstrap failed (log above)"
  fi
  strip_rootfs "$work/root"
  tar --numeric-owner --one-file-system -C "$work/root" \
    --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -cf "$work/rootfs.tar" .
  mv "$work/rootfs.tar" "$tar"
  remove_rootfs "$work/root"
  rm -rf "$work"
  trap - EXIT
  log "rootfs tarball: $tar ($(du -h "$tar" | cut -f1))"
}

ensure_base_image() {
  local base="$1" tar="$2"
  if image_exists "$base"; then
    log "base image $base present"
    return
  fi
  if [[ -f "$tar" ]]; then
    log "rootfs tarball $tar cached"
  else
    build_rootfs_tar "$tar"
  fi
  log "docker import -> $base"
  docker import --message "temper sandbox base ($SUITE minbase)" "$tar" "$base" >&2
}

build_image() {
  local base="$1" tag="$2" hash="$3" context
  context="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$context'" EXIT
  cp "$dockerfile" "$context/Dockerfile"
  mkdir "$context/agent"
  agent_files | while read -r f; do
    mkdir -p "$context/agent/$(dirname "$f")"
    cp "$agent_dir/$f" "$context/agent/$f"
  done
  log "docker build -> $tag"
  docker build --build-arg "BASE=$base" --label "org.temper.sandbox.inputs=$hash" \
    -t "$tag" "$context" >&2
  rm -rf "$context"
  trap - EXIT
  # Smoke test: the agent's interpreter runs, as the sandbox user, without a network.
  docker run --rm --network none "$tag" python3 -c \
    'import os, sys; assert sys.version_info[:2] == (3, 11) and os.getuid() == 10001' >&2 \
    || die "the new image $tag does not run python3 3.11 as uid 10001"
}

main() {
  local print_tag=0
  case "${1:-}" in
    "") ;;
    --print-tag) print_tag=1 ;;
    *) die "usage: $0 [--print-tag]" ;;
  esac
  [[ -f "$agent_dir/__main__.py" ]] || die "agent package not found at $agent_dir"
  local base_hash image_hash base tag tar
  base_hash="$(content_hash "$script" "$packages_file")"
  image_hash="$(printf '%s\n' "$base_hash" "$(content_hash "$dockerfile")" "$(agent_hash)" \
    | sha256sum | cut -c1-16)"
  base="$BASE_IMAGE:$base_hash"
  tag="$IMAGE:$image_hash"
  if [[ "$print_tag" -eq 1 ]]; then
    printf '%s\n' "$tag"
    return
  fi
  require_docker
  if image_exists "$tag"; then
    log "image $tag present"
  else
    mkdir -p "$cache_dir" 2>/dev/null && [[ -w "$cache_dir" ]] \
      || die "cache directory $cache_dir is not writable; set TEMPER_CACHE"
    exec 9>>"$cache_dir/.build.lock"
    flock 9  # one build at a time per cache directory
    tar="$cache_dir/sandbox-rootfs-$base_hash.tar"
    if ! image_exists "$tag"; then
      ensure_base_image "$base" "$tar"
      build_image "$base" "$tag" "$image_hash"
    fi
  fi
  docker tag "$tag" "$IMAGE:latest"
  printf '%s\n' "$tag"
}

main "$@"
