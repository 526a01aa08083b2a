#!/usr/bin/env bash
# The heavy set-up the test suite needs, built side by side while the venv builds and the
# first tests run (`make test` starts it in the background and waits for it at the end):
#   deploy/sglang-cpu/build.sh      the CPU SGLang server's venv        (~3 min, 2.7 GB)
#   deploy/temper/build-offline.sh  the sandbox image, then the services' image (~6 min)
#
#   deploy/prebuild.sh LOG   -> both builds' output in LOG; exits non-zero if one failed
#
# Each is cached outside the clone by a hash of its inputs, and each builder holds a lock
# while it builds: a test that needs one before it is ready runs the same script, waits on
# that lock and finds the build done instead of starting its own.  On a machine that has
# them, both finish in seconds.  On a fresh one they overlap the venv and the first tests
# (mostly pip unpacking and disk) instead of running before them.  A machine without the
# Docker engine gets no image here; the tests that need one say so themselves.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly EXIT_PREREQ=3
[ $# -eq 1 ] || { echo "usage: $0 LOG" >&2; exit 2; }
log="$1"
: >"$log"

# The venv and the tests come first (both unpack and write GBs): these take the CPU and
# the disk when they are idle.
low=(nice -n 10)
command -v ionice >/dev/null && low=(ionice -c 3 "${low[@]}")
"${low[@]}" "$here/sglang-cpu/build.sh" >>"$log" 2>&1 &
sglang=$!
# python3.11 rather than the project's venv, which may be half copied while this starts.
TEMPER_PYTHON="${TEMPER_PYTHON:-python3.11}" "${low[@]}" "$here/temper/build-offline.sh" >>"$log" 2>&1 &
image=$!

status=0
wait "$sglang" || { echo "prebuild: deploy/sglang-cpu/build.sh failed (see $log)" >&2; status=1; }
wait "$image"
code=$?
if [ "$code" -ne 0 ] && [ "$code" -ne "$EXIT_PREREQ" ]; then
  echo "prebuild: deploy/temper/build-offline.sh exited $code (see $log)" >&2
  status=1
fi
exit "$status"
