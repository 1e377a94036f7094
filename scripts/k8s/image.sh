#!/usr/bin/env bash
# Makes docker-archive image tarballs for the test cluster (up.sh), without
# docker or a registry: one layer, manifest.json with RepoTags, a config
# with rootfs.diff_ids and a default PATH. `ctr images import` (up.sh,
# import.sh) takes them as they are.
#
#   image.sh [options] NAME:TAG ROOTFS OUT.tar
#       ROOTFS: a directory, or a root file system tarball (plain, gzip, xz
#       or zstd, e.g. from mmdebstrap --format=tar). Options:
#         --entrypoint JSON   e.g. '["/bin/worker"]'
#         --cmd JSON          e.g. '["sh","-c","echo hi"]'
#         --user USER         e.g. 1000:1000
#         --workdir DIR       default /
#         --env KEY=VALUE     after PATH=/usr/local/sbin:...:/bin (repeatable)
#   image.sh pause                      the sandbox image (cached), prints its path
#   image.sh busybox [NAME:TAG [OUT]]   Debian's static busybox with a uid 1000
#                                       user "worker" and /tmp 1777 (cached),
#                                       prints its path
#   image.sh claude [NAME:TAG [OUT]]    Debian 12 with python3 and the host's
#                                       Claude Code (cached), prints its path
#
# Names: an image is called exactly what its RepoTags say; a NAME without a
# host part gets "localhost/" (worker:1 -> localhost/worker:1), and pods
# must use that name with imagePullPolicy: Never (or IfNotPresent and a tag
# other than latest). Cached images live in
# ${CORRAL_TEST_CACHE:-/var/cache/corral-test}/k8s/images.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

case "${1:-}" in
  pause) pause_image; exit ;;
  busybox) shift; busybox_image "$@"; exit ;;
  claude) shift; claude_image "$@"; exit ;;
  "" | -h | --help) usage ;;
esac

entry="" cmd="" user="" workdir=/ env=()
while [ $# -gt 0 ]; do
  case "$1" in
    --entrypoint) entry=$2; shift 2 ;;
    --cmd) cmd=$2; shift 2 ;;
    --user) user=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --env) env+=("$2"); shift 2 ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ $# -eq 3 ] || usage
for j in "$entry" "$cmd"; do
  [ -z "$j" ] || [[ $j == \[*\] ]] || die "--entrypoint and --cmd take a JSON array, not $j"
done
t=$(now)
mkimage "$1" "$2" "$3" "$entry" "$cmd" "$user" "$workdir" ${env[@]+"${env[@]}"}
say "$(image_name "$1") -> $3 ($(du -h "$3" | cut -f1), $(since "$t") s)"
