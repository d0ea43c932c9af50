#!/usr/bin/env bash
# Make the local base image of the CPU toolchain image: a minimal Debian
# bookworm root file system with python3, python3-venv and ca-certificates,
# made with debootstrap from the Debian mirror and loaded with `docker import`.
# No image registry is needed.
#
#   docker/make-base.sh [--force] [--tag TAG] [--mirror URL]
#
# Does nothing when TAG already exists, unless --force. Needs root (debootstrap
# chroots), debootstrap and a running Docker engine.
#
# The root file system is built in a private tmpfs when one can be mounted
# (debootstrap is bound by dpkg's many small writes and syncs: measured here
# with the packages already downloaded and another job on the machine,
# 28-30 s on tmpfs against 40-50 s on disk), else in a directory under TMPDIR.
# The list of installed Debian packages is kept in the image at
# /usr/share/reproci/base-packages.txt and its sha256 in a label.
set -euo pipefail

TAG=reproci/base-bookworm:1
SUITE=bookworm
MIRROR=${REPROCI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
INCLUDE=python3,python3-venv,ca-certificates
FORCE=0

die() { echo "make-base: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --tag) [ $# -ge 2 ] || die "--tag needs a value"; TAG=$2; shift ;;
    --mirror) [ $# -ge 2 ] || die "--mirror needs a value"; MIRROR=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

command -v docker >/dev/null || die "docker is not installed: install Docker (Debian and Ubuntu: apt-get install docker.io) and start its engine"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer: start it (systemctl start docker, or dockerd as root), or point DOCKER_HOST at one"

if [ "$FORCE" = 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "make-base: $TAG exists; nothing to do (--force makes it again)"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install -y debootstrap)"

start=$(now)
work=$(mktemp -d "${TMPDIR:-/tmp}/reproci-base.XXXXXX")
mounted=0
cleanup() {
  # debootstrap mounts proc and sys in the target; an interrupted run can leave them.
  awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  if [ "$mounted" = 1 ]; then umount "$work" 2>/dev/null || umount -l "$work" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if mount -t tmpfs -o size=2g,mode=0755 reproci-base "$work" 2>/dev/null; then
  mounted=1
else
  echo "make-base: no tmpfs could be mounted; building on disk (slower)"
fi
rootfs=$work/rootfs
log=$work/debootstrap.log

echo "make-base: debootstrap --variant=minbase $SUITE ($INCLUDE) from $MIRROR"
t=$(now)
if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$rootfs" "$MIRROR" >"$log" 2>&1; then
  tail -n 25 "$log" >&2
  die "debootstrap failed (last lines above); is $MIRROR reachable?"
fi
echo "make-base: debootstrap took $(took "$t")"

# Leave out what a toolchain image does not use: the downloaded .debs, the apt
# lists (apt-get update brings them back), logs with this machine's times,
# documentation other than the copyright files, manual pages and translations.
# hostname and resolv.conf were copied from this machine; the engine provides
# its own at run time.
t=$(now)
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
       "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
       "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
find "$rootfs"/usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
find "$rootfs"/usr/share/doc -mindepth 1 -type d -empty -delete
: >"$rootfs"/etc/hostname
: >"$rootfs"/etc/resolv.conf
mkdir -p "$rootfs"/usr/share/reproci
dpkg-query --admindir="$rootfs"/var/lib/dpkg -W -f '${Package}=${Version}\n' | LC_ALL=C sort \
  >"$rootfs"/usr/share/reproci/base-packages.txt
packages_sha=$(sha256sum "$rootfs"/usr/share/reproci/base-packages.txt | cut -d' ' -f1)
python_version=$(chroot "$rootfs" python3 -c 'import platform; print(platform.python_version())')
echo "make-base: trimmed to $(du -sh "$rootfs" | cut -f1) in $(took "$t"); python3 $python_version"

t=$(now)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tar --numeric-owner --xattrs -C "$rootfs" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL org.opencontainers.image.title=\"reproci base $SUITE\" \
org.opencontainers.image.description=\"Debian $SUITE minbase with python3 $python_version, made by docker/make-base.sh\" \
org.opencontainers.image.created=\"$created\" \
org.opencontainers.image.version=\"$TAG\" \
reproci.image.name=\"base-$SUITE\" \
reproci.base.suite=\"$SUITE\" \
reproci.base.mirror=\"$MIRROR\" \
reproci.base.python=\"$python_version\" \
reproci.base.packages.sha256=\"$packages_sha\"" \
  --message "debootstrap --variant=minbase --include=$INCLUDE $SUITE" \
  - "$TAG" >/dev/null || die "docker import failed"
echo "make-base: docker import took $(took "$t")"

id=$(docker image inspect --format '{{.Id}}' "$TAG")
size=$(docker image inspect --format '{{.Size}}' "$TAG" | awk '{ printf "%.0f MB", $1 / 1e6 }')
echo "make-base: made $TAG ($id, $size) in $(took "$start")"
