#!/usr/bin/env bash
# Starts a Docker engine for the tests, with gVisor's runsc registered as
# the runtime "runsc", unless one already answers at /var/run/docker.sock,
# and puts the tests' image on it: corral-test/debian:bookworm, a Debian 12
# minbase root file system built with mmdebstrap from Debian's mirror (no
# image registry is needed) and cached in $CORRAL_TEST_CACHE, so a later
# run on the same machine only imports it.
set -euo pipefail
cache=${CORRAL_TEST_CACHE:-/var/cache/corral-test}
image=corral-test/debian:bookworm
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

if ! $sudo docker info >/dev/null 2>&1; then
  echo "==> starting dockerd (log: $cache/dockerd.log)"
  $sudo mkdir -p "$cache"
  # runsc gets what Corral's docker runtime needs of it (it says so when a
  # flag is missing): --oci-seccomp, so gVisor applies the seccomp profile
  # inside its kernel; --host-uds=open, so a worker reaches the server's
  # unix sockets in its bind mounts; --network=none, as Corral's containers
  # have no network but loopback.
  cat <<'JSON' | $sudo tee "$cache/daemon.json" >/dev/null
{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp", "--host-uds=open"]}}}
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

if ! $sudo docker image inspect "$image" >/dev/null 2>&1; then
  tar="$cache/debian-bookworm.tar"
  if [ ! -s "$tar" ]; then
    echo "==> building $image with mmdebstrap (cached in $tar)"
    $sudo mkdir -p "$cache"
    $sudo mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm "$tar.tmp"
    $sudo mv "$tar.tmp" "$tar"
  fi
  echo "==> docker import $image"
  $sudo docker import "$tar" "$image" >/dev/null
fi
