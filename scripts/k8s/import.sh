#!/usr/bin/env bash
# Imports docker-archive image tarballs (image.sh makes them) into the
# running test cluster's containerd, namespace k8s.io, where the kubelet
# finds them: import.sh IMAGE.tar... Prints each image's name; pods use
# that name with imagePullPolicy: Never. Run as root, after up.sh.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
[ $# -gt 0 ] || die "usage: import.sh IMAGE.tar..."
if ! pid_alive containerd || [ ! -S "$K8S_CTRD_SOCK" ]; then
  die "no cluster running at $K8S_RUN (run up.sh)"
fi
import_images "$@"
