#!/usr/bin/env bash
# Builds a release of this checkout into dist/VERSION/, VERSION being
# `git describe --tags --always --dirty` (a tag, else the commit):
#
#   corral-VERSION-linux-ARCH.tar.gz    corral and corral-worker (static,
#                                       CGO_ENABLED=0, -trimpath, the version
#                                       stamped in), corral.service
#   corral-image-VERSION-ARCH.tar       the server's image, localhost/corral:VERSION:
#                                       `corral serve` for the kubernetes
#                                       runtime (corral k8s render's Deployment)
#   corral-worker-image-VERSION-ARCH.tar  the worker image, localhost/corral-worker:VERSION
#                                       (scripts/worker-image.sh: the agent CLIs)
#   SHA256SUMS                          of all of the above
#
# Both images are docker-archive tarballs built without docker or a
# registry, for the machine's own architecture only: `docker load -i`,
# `ctr images import`, or `skopeo copy docker-archive:FILE docker://REGISTRY/...`.
#
#   scripts/release.sh
#   ARCHES=amd64 IMAGES=server scripts/release.sh     only these
#   IMAGES= scripts/release.sh                        binaries only
#   OUT=/tmp/dist scripts/release.sh                  elsewhere than dist/
#   AGENTS=... scripts/release.sh                     the worker image's CLIs
#                                                     (scripts/worker-image.sh)
#
# The server image needs Debian's busybox-static (its shell and chown: the
# Deployment's init container runs chown) and CA certificates
# (ca-certificates); the worker image needs root and mmdebstrap, and takes
# a few minutes. Nothing is written into the checkout but OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
ARCHES=${ARCHES-amd64 arm64}
IMAGES=${IMAGES-server worker}
OUT=${OUT:-dist}

say() { echo "==> $*"; }
die() { echo "==> ERROR: $*" >&2; exit 1; }

command -v go >/dev/null || die "Go is needed"
version=$(git describe --tags --always --dirty) || die "git describe failed: a release is built from a git checkout"
# An image tag holds what corral k8s render's default image name holds
# (cmd/corral/k8s.go): the version with anything else as "-".
tag=$(printf '%s' "$version" | tr -c 'A-Za-z0-9_.-' '-')
out=$OUT/$version
# The files' times in the archives are the commit's, so that a rebuild of
# the same commit packs alike.
epoch=$(git log -1 --format=%ct)
ldflags="-s -w -X github.com/corral-dev/corral/internal/version.Version=$version"
host_arch=$(go env GOARCH)

for image in $IMAGES; do
  case "$image" in
    server) [[ " $ARCHES " == *" $host_arch "* ]] || die "the server image holds the $host_arch binaries: put $host_arch in ARCHES" ;;
    worker) ;;
    *) die "IMAGES: unknown image $image (server, worker)" ;;
  esac
done
if [ -n "$IMAGES" ] && [ "$(id -u)" != 0 ]; then
  die "the images are built as root (their files' owners; mmdebstrap): run as root, or IMAGES= for the binaries alone"
fi
rm -rf "$out"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for arch in $ARCHES; do
  name=corral-$version-linux-$arch
  say "go build $name"
  mkdir -p "$tmp/$name"
  # Static, so that the binaries run on any Linux and inside any sandbox:
  # corral-worker must sit beside corral.
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOFLAGS=-buildvcs=false \
    go build -trimpath -ldflags="$ldflags" -o "$tmp/$name/" ./cmd/corral ./cmd/corral-worker
  cp deploy/systemd/corral.service "$tmp/$name/"
  tar -C "$tmp" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -cf - "$name" |
    gzip -n >"$out/$name.tar.gz"
done

for image in $IMAGES; do
  case "$image" in
    server)
      bb=$(dpkg -L busybox-static 2>/dev/null | grep -m1 '/bin/busybox$') ||
        die "busybox-static is needed: apt-get install -y busybox-static"
      [ -s /etc/ssl/certs/ca-certificates.crt ] || die "ca-certificates is needed: apt-get install -y ca-certificates"
      say "server image localhost/corral:$tag"
      root=$tmp/server-root
      mkdir -p "$root"/{bin,etc/ssl/certs,tmp,usr/local/bin,var/lib/corral}
      chmod 755 "$root"
      # busybox, for the init container's chown and a shell to look
      # around with (kubectl exec): nothing else of a distribution.
      cp "$bb" "$root/bin/busybox"
      for app in $("$bb" --list); do
        [ "$app" = busybox ] || ln -s busybox "$root/bin/$app"
      done
      printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'corral:x:1000:1000:corral:/var/lib/corral:/bin/false' \
        'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$root/etc/passwd"
      printf '%s\n' 'root:x:0:' 'corral:x:1000:' 'nogroup:x:65534:' >"$root/etc/group"
      # Notifications to https callbacks and egress to the agents' APIs
      # verify certificates.
      cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
      cp "$tmp/corral-$version-linux-$host_arch"/corral{,-worker} "$root/usr/local/bin/"
      chmod 1777 "$root/tmp"
      chown 1000:1000 "$root/var/lib/corral"
      # Listening beyond loopback needs CORRAL_API_TOKEN; the rendered
      # Deployment gives its own arguments. No CORRAL_* variable: it
      # would override the rendered configuration's file (its data
      # root, where the claim is mounted).
      scripts/k8s/image.sh --entrypoint '["/usr/local/bin/corral"]' \
        --cmd '["serve","--listen","0.0.0.0:7777","--data","/var/lib/corral"]' \
        --user 1000:1000 --workdir /var/lib/corral \
        "corral:$tag" "$root" "$out/corral-image-$version-$host_arch.tar"
      ;;
    worker)
      say "worker image localhost/corral-worker:$tag"
      CORRAL_VERSION=$version scripts/worker-image.sh "corral-worker:$tag" "$out/corral-worker-image-$version-$host_arch.tar"
      ;;
  esac
done

(cd "$out" && sha256sum -- * >SHA256SUMS)
say "release $version in $out:"
cat "$out/SHA256SUMS"
