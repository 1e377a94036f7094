#!/usr/bin/env bash
# Builds the worker image (deploy/Dockerfile's target worker) without docker
# or an image registry, as a docker-archive tarball: a Debian 13 minbase
# root file system from mmdebstrap with Node.js, npm, git, python3 and CA
# certificates, the agent CLIs of scripts/agent-clis.txt installed by npm
# inside it, Corral's static binary at /usr/local/bin/corral and a user
# "worker" (uid 1000), packed by scripts/k8s/image.sh to run as 1000:1000.
#
#   scripts/worker-image.sh [NAME:TAG [OUT.tar]]
#       default corral-worker:latest, ./corral-worker.tar
#   AGENTS="claude codex" scripts/worker-image.sh ...   only these CLIs
#   AGENTS=none scripts/worker-image.sh ...             no agent CLI
#   CORRAL_VERSION=v1.2.0 scripts/worker-image.sh ...   the version stamped into
#       corral (default: git describe --tags --always --dirty)
#
# Load it with scripts/k8s/import.sh OUT.tar (the test cluster, which names
# it localhost/NAME:TAG: set ai_worker_config.ai_coder_image to that and
# kubernetes.pull_policy to Never) or docker load -i OUT.tar. Run as root
# (mmdebstrap). Takes a few minutes; the image is about 2 GB with every agent.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
name=${1:-corral-worker:latest}
out=${2:-corral-worker.tar}
[ "$(id -u)" = 0 ] || { echo "run as root (mmdebstrap)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is needed: apt-get install -y mmdebstrap" >&2; exit 1; }
[ -x scripts/k8s/image.sh ] || { echo "scripts/k8s/image.sh is missing" >&2; exit 1; }

# The npm packages of the agents asked for.
packages=()
while IFS= read -r line; do
  bin=${line%%:*}
  if [ -z "${AGENTS+x}" ] || [[ " $AGENTS " == *" $bin "* ]]; then
    packages+=("${line#*:}")
  fi
done < <(grep -v -e '^#' -e '^$' scripts/agent-clis.txt)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
version=${CORRAL_VERSION:-$(git describe --tags --always --dirty)}
echo "==> go build corral $version (static)"
CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
  -ldflags="-s -w -X github.com/corral-dev/corral/internal/version.Version=$version" -o "$tmp/corral" ./cmd/corral

hooks=(
  --customize-hook="copy-in $tmp/corral /usr/local/bin"
  --customize-hook='echo "worker:x:1000:1000::/tmp:/bin/sh" >>"$1/etc/passwd"; echo "worker:x:1000:" >>"$1/etc/group"'
)
if [ ${#packages[@]} -gt 0 ]; then
  # npm runs in the image's root, with the image's node, so the CLIs'
  # install scripts fetch the native binaries for it; it reaches the
  # registry this machine's npm uses, trusting the certificates this
  # machine's npm trusts (for the build only: /tmp is emptied below).
  registry="" ca=/etc/ssl/certs/ca-certificates.crt
  if command -v npm >/dev/null; then
    registry=$(npm config get registry)
    c=$(npm config get cafile)
    [ -f "$c" ] && ca=$c
  fi
  cp "$ca" "$tmp/build-ca.crt"
  hooks+=(
    --customize-hook="copy-in $tmp/build-ca.crt /tmp"
    --customize-hook="chroot \"\$1\" env NODE_EXTRA_CA_CERTS=/tmp/build-ca.crt npm install -g --no-audit --no-fund --loglevel=error ${registry:+--registry=$registry} ${packages[*]}"
  )
fi
hooks+=(--customize-hook='rm -rf "$1/root/.npm" "$1"/tmp/* "$1"/var/cache/apt/archives/*.deb')
echo "==> mmdebstrap trixie with ${packages[*]:-no agent CLI}"
mmdebstrap --quiet --variant=minbase --format=tar \
  --include=ca-certificates,git,nodejs,npm,python3 \
  "${hooks[@]}" trixie "$tmp/rootfs.tar"
scripts/k8s/image.sh --user 1000:1000 --workdir /tmp "$name" "$tmp/rootfs.tar" "$out"
