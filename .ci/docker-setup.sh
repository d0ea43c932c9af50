#!/usr/bin/env bash
# Make a fresh Debian machine ready for the Docker tests, as root:
#   1. install docker.io and debootstrap (skipped when present);
#   2. start dockerd in the background unless an engine already answers
#      (log: $REPROCI_DOCKERD_LOG, default /var/log/reproci-dockerd.log);
#   3. make the base image (docker/make-base.sh; skipped when it exists);
#   4. build the CPU image (docker/build-image.sh; skipped when up to date);
#   5. check that python3 in the image imports torch and numpy, offline.
# Each step says how long it took. A second run on a ready machine takes a
# few seconds. Exits non-zero with a message naming the step that failed.
#
#   .ci/docker-setup.sh [IMAGE ...]     (default: cpu-torch2.13)
#   .ci/docker-setup.sh --base          (steps 1-3 only: no Python environment needed, so
#                                        .ci/run makes the base image while pip installs)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base_only=0
if [ "${1-}" = "--base" ]; then base_only=1; shift; fi
images=("$@")
[ ${#images[@]} -gt 0 ] || images=(cpu-torch2.13)
[ "$base_only" = 0 ] || images=()
DOCKERD_LOG=${REPROCI_DOCKERD_LOG:-/var/log/reproci-dockerd.log}
DOCKERD_WAIT_S=${REPROCI_DOCKERD_WAIT_S:-60}

die() { echo "docker-setup: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
step() { echo; echo "docker-setup: == $* =="; }

start=$(now)
[ "$(id -u)" = 0 ] || die "run as root (it installs packages, starts dockerd and runs debootstrap)"

# --- 1. packages ------------------------------------------------------------------------
step "packages"
t=$(now)
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
# BuildKit without the buildx plugin needs Debian's own client (/usr/bin/docker).
if ! docker buildx version >/dev/null 2>&1 && [ ! -x /usr/bin/docker ]; then
  case " ${missing[*]-} " in *" docker.io "*) ;; *) missing+=(docker.io) ;; esac
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "docker-setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
else
  echo "docker-setup: docker.io and debootstrap are installed"
fi
echo "docker-setup: packages took $(took "$t")"

# --- 2. the engine ------------------------------------------------------------------------
step "dockerd"
t=$(now)
if docker info >/dev/null 2>&1; then
  echo "docker-setup: the Docker engine answers"
else
  # A pid file left by an engine that is gone keeps a new one from starting.
  if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
  fi
  echo "docker-setup: starting dockerd (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
  dockerd_pid=$!
  waited=0
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
      tail -n 20 "$DOCKERD_LOG" >&2
      die "dockerd exited while starting (last lines of $DOCKERD_LOG above)"
    fi
    if [ "$waited" -ge $((DOCKERD_WAIT_S * 5)) ]; then
      tail -n 20 "$DOCKERD_LOG" >&2
      die "dockerd did not answer within ${DOCKERD_WAIT_S} s (last lines of $DOCKERD_LOG above)"
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  echo "docker-setup: dockerd (pid $dockerd_pid) answers"
fi
echo "docker-setup: dockerd took $(took "$t")"

# --- 3. the base image ---------------------------------------------------------------------
step "base image"
t=$(now)
"$root/docker/make-base.sh" || die "making the base image failed (docker/make-base.sh)"
echo "docker-setup: base image took $(took "$t")"

# --- 4. and 5. the images -------------------------------------------------------------------
for name in ${images[@]+"${images[@]}"}; do
  step "image $name"
  t=$(now)
  "$root/docker/build-image.sh" "$name" || die "building $name failed (docker/build-image.sh $name)"
  echo "docker-setup: image $name took $(took "$t")"

  tag=$("$root/docker/build-image.sh" "$name" --print-tag) || die "no tag for $name in docker/manifest.yaml"
  t=$(now)
  out=$(docker run --rm --network none --user 1000:1000 "$tag" \
          python3 -c 'import sys, torch, numpy; print(sys.executable, torch.__version__, numpy.__version__)' 2>&1) \
    || { echo "$out" >&2; die "$tag does not import torch and numpy (output above)"; }
  echo "docker-setup: $tag runs: $out ($(took "$t"))"
done

echo
echo "docker-setup: ready in $(took "$start")"
