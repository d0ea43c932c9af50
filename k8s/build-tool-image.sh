#!/usr/bin/env bash
# Build the tool image of `reproci matrix --format k8s` from this checkout (docs/kubernetes.md).
#
#   k8s/build-tool-image.sh [TAG]      (default reproci/tool:VERSION, VERSION from pyproject.toml)
#
# 1. fills the wheelhouse .cache/wheelhouse/tool: reproci's wheel (pip wheel of this checkout)
#    and the hash-pinned wheels of k8s/tool-lib.txt and k8s/tool-venv.txt (pip download, for
#    CPython 3.11 on x86_64, the base image's python3), with those two files;
# 2. runs `docker build` with BuildKit, the wheelhouse as build context.
#
# Environment: PYTHON (host interpreter with pip, default python3), BASE_IMAGE (default
# reproci/base-bookworm:1, made by docker/make-base.sh; any Debian-based image with python3 3.11
# and venv will do, by digest), REPROCI_DOCKER (the docker client; default: the first of docker,
# /usr/bin/docker with BuildKit, as docker/build-image.sh picks it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
PYTHON=${PYTHON:-python3}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml")
tag=${1:-reproci/tool:$version}
house=$root/.cache/wheelhouse/tool

# BuildKit (for the bind mount): `buildx build --load`, or a client older than 23 with DOCKER_BUILDKIT=1
pick_builder() {
  local c major
  for c in ${REPROCI_DOCKER:-docker /usr/bin/docker}; do
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" buildx version >/dev/null 2>&1; then BUILD=("$c" buildx build --load); return 0; fi
    major=$("$c" version --format '{{.Client.Version}}' 2>/dev/null | sed -n 's/^\([0-9]*\)\..*/\1/p')
    if [ -n "$major" ] && [ "$major" -lt 23 ]; then BUILD=(env DOCKER_BUILDKIT=1 "$c" build); return 0; fi
  done
  echo "build-tool-image: error: no docker client with BuildKit: install the buildx plugin" >&2
  return 1
}
pick_builder

rm -rf "$house" && mkdir -p "$house"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$house" "$root"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
  --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --dest "$house" -r "$here/tool-lib.txt" -r "$here/tool-venv.txt"
cp "$here/tool-lib.txt" "$here/tool-venv.txt" "$house/"
"${BUILD[@]}" --file "$here/Dockerfile.tool" --tag "$tag" \
  --build-arg "BASE_IMAGE=${BASE_IMAGE:-reproci/base-bookworm:1}" --build-arg "IMAGE_TAG=$tag" "$house"
echo "built $tag"
