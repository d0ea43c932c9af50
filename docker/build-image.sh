#!/usr/bin/env bash
# Build one toolchain image of docker/manifest.yaml (or of the manifest
# REPROCI_MANIFEST names).
#
#   docker/build-image.sh NAME [--force] [--no-cache]
#   docker/build-image.sh NAME --print-tag    (prints the image's tag only)
#   docker/build-image.sh NAME --print-wheelhouse    (prints its wheelhouse folder only)
#
# 1. reads NAME's entry of the manifest (python3 with PyYAML on the host);
# 2. fills the wheelhouse .cache/wheelhouse/NAME (or $REPROCI_WHEELHOUSE/NAME) on the host with
#    `pip download --no-deps --only-binary=:all: --require-hashes` from the
#    image's requirements file (for the image's Python version and x86_64), so
#    the build itself needs no network;
# 3. runs `docker build` with BuildKit, the wheelhouse as build context and
#    BASE_IMAGE=image@digest (or the local base image).
#
# The entry's dockerfile and requirements are relative to the manifest's folder;
# a dockerfile not there is the one of that name beside this script (a manifest
# of one's own reuses reproci's Dockerfile.cpu without a copy). The wheelhouse
# and the image's VCS labels belong to the folder above the manifest's.
#
# The image is labelled with a hash of everything it is made from (Dockerfile,
# requirements, base image, build args). When an image with that tag and that
# hash exists, nothing is done, unless --force. --no-cache also bypasses the
# engine's build cache.
#
# Environment: PYTHON (host interpreter, default python3), REPROCI_MANIFEST
# (the manifest to read; default: manifest.yaml beside this script; `reproci
# images build` sets it to the image's own manifest), REPROCI_WHEELHOUSE (the
# folder of the wheelhouses, default .cache/wheelhouse in the folder above the
# manifest's; `reproci images build` sets it to the user's cache for the manifest
# a pip install ships, never site-packages), REPROCI_DOCKER (the
# docker client to build with; default: the first of docker, /usr/bin/docker
# that has BuildKit).
set -euo pipefail

die() { echo "build-image: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

NAME=
FORCE=0
NO_CACHE=()
PRINT_TAG=0
PRINT_WHEELHOUSE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --no-cache) NO_CACHE=(--no-cache); FORCE=1 ;;
    --print-tag) PRINT_TAG=1 ;;
    --print-wheelhouse) PRINT_WHEELHOUSE=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) [ -z "$NAME" ] || die "one image name at a time (got $NAME and $1)"; NAME=$1 ;;
  esac
  shift
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
manifest=${REPROCI_MANIFEST:-$here/manifest.yaml}
PYTHON=${PYTHON:-python3}
[ -n "$NAME" ] || die "usage: docker/build-image.sh NAME; images: $("$PYTHON" -c 'import sys, yaml; print(" ".join(yaml.safe_load(open(sys.argv[1]))["images"]))' "$manifest" 2>/dev/null || echo "(see $manifest)")"
[ -f "$manifest" ] || die "$manifest does not exist (REPROCI_MANIFEST names the manifest to read)"
recipes=$(cd "$(dirname "$manifest")" && pwd)  # the entry's paths are relative to the manifest's folder
root=$(cd "$recipes/.." && pwd)  # holds .cache/wheelhouse; its git commit labels the image
wheelhouse=${REPROCI_WHEELHOUSE:-$root/.cache/wheelhouse}/$NAME
if [ "$PRINT_WHEELHOUSE" = 1 ]; then echo "$wheelhouse"; exit 0; fi

start=$(now)

# --- 1. the manifest entry, as shell assignments -----------------------------
entry=$("$PYTHON" - "$manifest" "$NAME" <<'EOF'
import shlex, sys
try:
    import yaml
except ImportError:
    sys.exit("PyYAML is missing for this python3: pip install pyyaml")
path, name = sys.argv[1], sys.argv[2]
with open(path) as f:
    doc = yaml.safe_load(f)
if doc.get("version") != 1:
    sys.exit(f"{path}: version {doc.get('version')!r} is not 1; this script reads version 1")
images = doc.get("images") or {}
if name not in images:
    sys.exit(f"no image {name!r} in {path}; images: {', '.join(images)}")
img = images[name]
try:
    base = img["base"]
    out = {
        "DOCKERFILE": img["dockerfile"],
        "BASE_NAME": base["image"],
        "BASE_DIGEST": base.get("digest") or "",
        "PYTHON_VERSION": str(img["python"]),
        "REQUIREMENTS": img["requirements"],
        "TAG": img["tag"],
    }
    args = [f"{k}={v}" for k, v in sorted((img.get("build_args") or {}).items())]
except KeyError as e:
    sys.exit(f"{path}: image {name!r} lacks the field {e.args[0]!r}")
for k, v in out.items():
    print(f"{k}={shlex.quote(v)}")
print("EXTRA_ARGS=(" + " ".join(shlex.quote(a) for a in args) + ")")
EOF
) || die "cannot read $NAME from $manifest"
eval "$entry"
if [ "$PRINT_TAG" = 1 ]; then echo "$TAG"; exit 0; fi

# shellcheck disable=SC2153  # DOCKERFILE and REQUIREMENTS come from the eval above
dockerfile=$recipes/$DOCKERFILE
if [ ! -f "$dockerfile" ] && [ -f "$here/$DOCKERFILE" ]; then dockerfile=$here/$DOCKERFILE; fi  # reproci's own
# shellcheck disable=SC2153
requirements=$recipes/$REQUIREMENTS
[ -f "$dockerfile" ] || die "$dockerfile does not exist"
[ -f "$requirements" ] || die "$requirements does not exist"

# --- the docker client: BuildKit is needed for the wheelhouse bind mount ------
# A client with the buildx plugin builds with `buildx build --load`. Without
# the plugin, clients older than 23 still carry BuildKit (DOCKER_BUILDKIT=1);
# Debian bookworm's docker.io client (/usr/bin/docker) is one, and is used when
# the first docker on PATH is a newer client without buildx.
client_major() { "$1" version --format '{{.Client.Version}}' 2>/dev/null | sed -n 's/^\([0-9]*\)\..*/\1/p'; }
pick_builder() {
  local c major
  for c in ${REPROCI_DOCKER:-docker /usr/bin/docker}; do
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" buildx version >/dev/null 2>&1; then
      BUILD=("$c" buildx build --load); DOCKER=$c; return 0
    fi
    major=$(client_major "$c")
    if [ -n "$major" ] && [ "$major" -lt 23 ]; then
      BUILD=(env DOCKER_BUILDKIT=1 "$c" build); DOCKER=$c; return 0
    fi
  done
  return 1
}
pick_builder || die "no docker client with BuildKit: install the buildx plugin (docker-buildx) or Debian's docker.io client"
"$DOCKER" info >/dev/null 2>&1 || die "the Docker engine does not answer: start it (systemctl start docker, or dockerd as root), or point DOCKER_HOST at one"

# --- the base image ------------------------------------------------------------
if [ -n "$BASE_DIGEST" ]; then
  case "$BASE_DIGEST" in sha256:[0-9a-f]*) ;; *) die "base digest of $NAME is not sha256:...: $BASE_DIGEST" ;; esac
  BASE_REF="${BASE_NAME%@*}@$BASE_DIGEST"
  base_id=$BASE_DIGEST
else
  # A base made on this machine: identified by its image ID.
  BASE_REF=$BASE_NAME
  base_id=$("$DOCKER" image inspect --format '{{.Id}}' "$BASE_NAME" 2>/dev/null) \
    || die "base image $BASE_NAME does not exist; make it first with docker/make-base.sh"
fi

req_sha=$(sha256sum "$requirements" | cut -d' ' -f1)
inputs_sha=$( { echo "$NAME $TAG $PYTHON_VERSION $BASE_REF $base_id"; printf '%s\n' "${EXTRA_ARGS[@]}";
                cat "$dockerfile" "$requirements"; } | sha256sum | cut -d' ' -f1)

if [ "$FORCE" = 0 ]; then
  have=$("$DOCKER" image inspect --format '{{ index .Config.Labels "reproci.image.inputs.sha256" }}' "$TAG" 2>/dev/null || true)
  if [ "$have" = "$inputs_sha" ]; then
    echo "build-image: $TAG is up to date (inputs $inputs_sha); nothing to do (--force builds it again)"
    exit 0
  fi
fi

# --- 2. the wheelhouse -------------------------------------------------------------
mkdir -p "$wheelhouse"
t=$(now)
pyver_nodot=${PYTHON_VERSION//./}
platforms=()
# Every manylinux level the bookworm base (glibc 2.36) runs, down to the oldest: the CUDA
# wheels come tagged manylinux_2_25, _2_17 or manylinux1 as well as _2_28.
for minor in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
for p in manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
echo "build-image: wheelhouse $wheelhouse (cp$pyver_nodot x86_64)"
if ! "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --require-hashes --implementation cp --python-version "$PYTHON_VERSION" --abi "cp$pyver_nodot" \
      --abi none --abi abi3 "${platforms[@]}" \
      -r "$requirements" -d "$wheelhouse" 2>"$wheelhouse.log"; then
  grep -v "is ignored: it is neither a file nor a directory" "$wheelhouse.log" | tail -n 20 >&2
  die "pip download failed for $REQUIREMENTS (output above, all of it in $wheelhouse.log)"
fi
# Keep exactly the pinned wheels: older pins left behind would only enlarge the
# build context. Wheel file names start with name-version (PEP 427).
"$PYTHON" - "$requirements" "$wheelhouse" <<'EOF'
import pathlib, re, sys
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
pins = set()
for line in open(sys.argv[1]):
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
    if m:
        pins.add((norm(m.group(1)), m.group(2)))
for whl in pathlib.Path(sys.argv[2]).glob("*.whl"):
    name, version = whl.name.split("-")[:2]
    if (norm(name), version) not in pins:
        whl.unlink()
EOF
cp "$requirements" "$wheelhouse/requirements.txt"
echo "build-image: wheelhouse ready: $(find "$wheelhouse" -maxdepth 1 -name "*.whl" | wc -l) wheels, $(du -sh "$wheelhouse" | cut -f1), took $(took "$t")"

# --- 3. the build ------------------------------------------------------------------
vcs_ref=$(git -C "$root" rev-parse --verify -q HEAD 2>/dev/null || true)
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
else
  # The commit's time, not the clock: rebuilding one commit gives the same labels.
  created=$(TZ=UTC git -C "$root" log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null \
            || date -u +%Y-%m-%dT%H:%M:%SZ)
fi
build_args=(
  --build-arg "BASE_IMAGE=$BASE_REF"
  --build-arg "BASE_DIGEST=$base_id"
  --build-arg "IMAGE_NAME=$NAME"
  --build-arg "IMAGE_TAG=$TAG"
  --build-arg "REQUIREMENTS_SHA256=$req_sha"
  --build-arg "INPUTS_SHA256=$inputs_sha"
  --build-arg "VCS_REF=$vcs_ref"
  --build-arg "CREATED=$created"
)
for a in "${EXTRA_ARGS[@]}"; do build_args+=(--build-arg "$a"); done

echo "build-image: building $TAG from $DOCKERFILE on $BASE_REF"
t=$(now)
"${BUILD[@]}" "${NO_CACHE[@]}" --progress=plain -f "$dockerfile" -t "$TAG" "${build_args[@]}" "$wheelhouse" \
  || die "docker build of $TAG failed (output above)"
echo "build-image: docker build took $(took "$t")"

id=$("$DOCKER" image inspect --format '{{.Id}}' "$TAG")
size=$("$DOCKER" image inspect --format '{{.Size}}' "$TAG" | awk '{ printf "%.0f MB", $1 / 1e6 }')
echo "build-image: built $TAG ($id, $size) in $(took "$start")"
