#!/usr/bin/env bash
# Starts a Docker engine for the tests, with gVisor's runsc registered as
# the runtime "runsc", unless one already answers at /var/run/docker.sock,
# and puts the tests' images on it: corral-test/debian:bookworm and
# corral-test/python:bookworm (with matplotlib), Debian 12 minbase root file
# systems built with mmdebstrap from Debian's mirror (no image registry is
# needed) and cached in $CORRAL_TEST_CACHE, so a later run on the same
# machine only imports them.
set -euo pipefail
cache=${CORRAL_TEST_CACHE:-/var/cache/corral-test}
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

# The engine reads "experimental" only when it starts (a SIGHUP does not
# change it): the tests' own engine, started by an earlier version of this
# script without it, is stopped here and started again below.
if [ "$($sudo docker info --format '{{.ExperimentalBuild}}' 2>/dev/null)" = false ] &&
  pid=$(pgrep -f "^dockerd --config-file $cache/daemon.json"); then
  echo "==> restarting the tests' dockerd with experimental features (its checkpoints need them)"
  $sudo kill $pid
  for _ in $(seq 1 150); do
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
  done
fi

if ! $sudo docker info >/dev/null 2>&1; then
  echo "==> starting dockerd (log: $cache/dockerd.log)"
  $sudo mkdir -p "$cache"
  # runsc gets what Corral's docker runtime needs of it (it says so when a
  # flag is missing): --oci-seccomp, so gVisor applies the seccomp profile
  # inside its kernel; --host-uds=open, so a worker reaches the server's
  # unix sockets in its bind mounts; --network=none, as Corral's containers
  # have no network but loopback. Experimental features on: the engine's
  # checkpoints need them, which keep a docker+runsc session's memory
  # across a suspend.
  cat <<'JSON' | $sudo tee "$cache/daemon.json" >/dev/null
{"experimental": true, "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp", "--host-uds=open"]}}}
JSON
  # No bridge and no iptables rules: no container of Corral's has a
  # network interface besides loopback.
  $sudo sh -c "nohup dockerd --config-file '$cache/daemon.json' --bridge=none --iptables=false >'$cache/dockerd.log' 2>&1 &"
  for _ in $(seq 1 100); do
    $sudo docker info >/dev/null 2>&1 && break
    sleep 0.2
  done
  $sudo docker info >/dev/null || { tail -20 "$cache/dockerd.log" >&2; exit 1; }
fi

# Another engine, not started here, may have them off: the tests of a
# docker+runsc session's memory then fail under CI=true and skip elsewhere.
if [ "$($sudo docker info --format '{{.ExperimentalBuild}}' 2>/dev/null)" != true ]; then
  echo "==> note: the Docker engine's experimental features are off (its checkpoints need them); restart it with \"experimental\": true in its daemon.json to run the docker+runsc memory tests" >&2
fi

# image NAME TAR PACKAGES: NAME on the engine, from a Debian 12 minbase
# root file system with PACKAGES, built once into $cache/TAR.
image() {
  local name=$1 tar=$cache/$2 packages=$3
  $sudo docker image inspect "$name" >/dev/null 2>&1 && return
  if [ ! -s "$tar" ]; then
    echo "==> building $name with mmdebstrap (cached in $tar)"
    $sudo mkdir -p "$cache"
    $sudo mmdebstrap --quiet --format=tar --variant=minbase --include="$packages" bookworm "$tar.tmp"
    $sudo mv "$tar.tmp" "$tar"
  fi
  echo "==> docker import $name"
  $sudo docker import "$tar" "$name" >/dev/null
}
# An image with no libc, no /etc and no /usr: Debian's static busybox alone,
# to show a task runs in any image.
if ! $sudo docker image inspect corral-test/busybox:1 >/dev/null 2>&1; then
  echo "==> docker import corral-test/busybox:1"
  dir=$(mktemp -d)
  mkdir "$dir/bin"
  cp "$(command -v busybox)" "$dir/bin/busybox"
  for app in sh echo cat ls id; do ln -s busybox "$dir/bin/$app"; done
  tar -C "$dir" -c bin | $sudo docker import - corral-test/busybox:1 >/dev/null
  rm -rf "$dir"
fi
image corral-test/debian:bookworm debian-bookworm.tar ca-certificates
# seed 004's chart from a CSV, end to end.
image corral-test/python:bookworm python-bookworm.tar ca-certificates,python3-matplotlib
