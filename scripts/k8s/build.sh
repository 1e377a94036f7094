#!/usr/bin/env bash
# Builds what the single-node test cluster (up.sh) runs, into
# ${CORRAL_TEST_CACHE:-/var/cache/corral-test}/k8s, outside the checkout, so
# later runs on the same machine reuse it:
#
#   bin/   kube-apiserver kube-controller-manager kube-scheduler kubelet
#          kubectl (Kubernetes $K8S_VERSION) and etcd ($ETCD_VERSION), from
#          Go modules in one `go build`; runsc and containerd-shim-runsc-v1
#          (gVisor $GVISOR_VERSION, patched, see below) in another;
#          kube-router ($KUBE_ROUTER_VERSION) in a third
#   images/pause.tar  the sandbox image (pause.go)
#   gomod/ gocache/   this build's Go module and build caches
#   src/              the generated scratch modules
#   versions          the stamp: what bin/ was built from
#
# Parts whose stamp line matches the pinned versions are skipped, so a second
# run takes a second. Also installs the Debian packages the node needs.
# Cold, on 2 cores: about 10 minutes and 2 GB of memory at peak.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# The Go environment of every build here: own caches, no toolchain
# download, no workspace of the caller, static binaries.
go_env() {
  export GOMODCACHE=$K8S_CACHE/gomod GOCACHE=$K8S_CACHE/gocache
  export GOTOOLCHAIN=local GOWORK=off GOFLAGS="-buildvcs=false -mod=mod" CGO_ENABLED=0
}

# stamped LINE: bin/ holds the part LINE describes.
stamped() { grep -qxF "$1" "$K8S_CACHE/versions" 2>/dev/null; }
stamp() {
  { grep -vF "${1%% *} " "$K8S_CACHE/versions" 2>/dev/null || true; echo "$1"; } >"$K8S_CACHE/versions.tmp"
  mv "$K8S_CACHE/versions.tmp" "$K8S_CACHE/versions"
}

# have BINARY...: all are in bin/.
have() {
  local b
  for b in "$@"; do [ -x "$K8S_BIN/$b" ] || return 1; done
}

# modfield JSON FIELD: a string field of `go mod download -json` output.
modfield() { sed -n "s/^\t\"$2\": \"\(.*\)\",\{0,1\}$/\1/p" <<<"$1"; }

packages() {
  local missing=() want pkg
  for want in containerd:/usr/bin/containerd runc:/usr/sbin/runc \
    containernetworking-plugins:/usr/lib/cni/bridge busybox-static:/bin/busybox \
    iptables:/usr/sbin/iptables ipset:/usr/sbin/ipset openssl:/usr/bin/openssl curl:/usr/bin/curl iproute2:/usr/sbin/ip; do
    pkg=${want%%:*}
    # By package status: the dynamic "busybox" package has a /bin/busybox too.
    [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ] || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing Debian packages: ${missing[*]} (run build.sh as root once)"
    say "installing ${missing[*]}"
    local t; t=$(now)
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # No systemd here, but where there is one, the packaged containerd must
    # not be what the node talks to: up.sh starts its own.
    say "packages installed in $(since "$t") s"
  fi
}

build_k8s() {
  local line="kubernetes $K8S_VERSION etcd $ETCD_VERSION" b
  local bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd)
  if stamped "$line" && have "${bins[@]}"; then
    say "Kubernetes $K8S_VERSION and etcd $ETCD_VERSION already built"
    return
  fi
  local t src=$K8S_CACHE/src/k8s json gomod staging
  t=$(now)
  say "building Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl) and etcd $ETCD_VERSION"
  rm -rf "$src"; mkdir -p "$src"; cd "$src"
  json=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION") || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed: $json"
  gomod=$(modfield "$json" GoMod)
  [ -s "$gomod" ] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION"
  # k8s.io/kubernetes requires its staging modules (k8s.io/api, ...) at
  # v0.0.0 and replaces them with ./staging/src/...; a dependency's replaces
  # are ignored, so this module points each at its published tag, v1.X.Y ->
  # v0.X.Y. The go and godebug lines are copied too.
  staging=v0.${K8S_VERSION#v1.}
  {
    echo "module corralk8sbuild"
    echo
    grep -E '^(go|godebug) ' "$gomod"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo ")"
    echo
    echo "replace ("
    sed -n "s#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\t\1 => \1 $staging#p" "$gomod"
    echo ")"
  } >go.mod
  local n
  n=$(grep -c " => k8s.io/.* $staging\$" go.mod)
  [ "$n" -gt 20 ] || die "found only $n staging replaces in k8s.io/kubernetes's go.mod"
  cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
EOF
  local t2; t2=$(now)
  go mod tidy
  say "go mod tidy: $(since "$t2") s ($n staging replaces)"
  local got
  got=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
  [ "$got" = "$ETCD_VERSION" ] || die "etcd resolved to $got, not $ETCD_VERSION"
  # Version stamping: without it the binaries call themselves v0.0.0-master.
  local ldf="-s -w" p minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  local out=$K8S_CACHE/out-k8s
  rm -rf "$out"; mkdir -p "$out"
  t2=$(now)
  go build -trimpath -ldflags="$ldf" -o "$out/" go.etcd.io/etcd/server/v3 \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet
  say "go build: $(since "$t2") s"
  # `go build -o dir/` names etcd's binary after the element before /v3.
  mv "$out/server" "$out/etcd"
  mkdir -p "$K8S_BIN"
  for b in "${bins[@]}"; do mv "$out/$b" "$K8S_BIN/$b"; done
  rmdir "$out"
  stamp "$line"
  say "Kubernetes and etcd built in $(since "$t") s"
}

build_gvisor() {
  local line="gvisor $GVISOR_VERSION $GVISOR_PATCH"
  if stamped "$line" && have runsc containerd-shim-runsc-v1; then
    say "gVisor $GVISOR_VERSION ($GVISOR_PATCH) already built"
    return
  fi
  local t src=$K8S_CACHE/src/gvisor json dir
  t=$(now)
  say "building gVisor $GVISOR_VERSION (runsc, containerd-shim-runsc-v1)"
  rm -rf "$src"; mkdir -p "$src"; cd "$src"
  json=$(go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION") || die "go mod download gvisor.dev/gvisor@$GVISOR_VERSION failed: $json"
  dir=$(modfield "$json" Dir)
  [ -d "$dir" ] || die "no source for gvisor.dev/gvisor@$GVISOR_VERSION"
  cp -r "$dir" gvisor
  chmod -R u+w gvisor
  # The patch: the shim sets its own oom_score_adj to -999 and gives up when
  # that is refused. Where root lacks CAP_SYS_RESOURCE (this test VM) the
  # kernel refuses to lower it; go on with the inherited score instead.
  local f=gvisor/pkg/shim/v1/service.go
  local from='if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMaxKillable); err != nil {'
  local to='if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMaxKillable); err != nil \&\& !os.IsPermission(err) {'
  grep -qF "$from" "$f" || die "gVisor patch: no SetOOMScore call in $f"
  sed -i "s/$from/$to/" "$f"
  grep -qF 'err != nil && !os.IsPermission(err) {' "$f" || die "gVisor patch did not apply"
  cat >go.mod <<EOF
module corralgvisorbuild

go 1.23.1

require gvisor.dev/gvisor $GVISOR_VERSION

replace gvisor.dev/gvisor => ./gvisor
EOF
  cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
EOF
  local t2; t2=$(now)
  go mod tidy
  say "go mod tidy: $(since "$t2") s"
  local out=$K8S_CACHE/out-gvisor
  rm -rf "$out"; mkdir -p "$out"
  t2=$(now)
  go build -trimpath -ldflags='-s -w' -o "$out/" gvisor.dev/gvisor/runsc gvisor.dev/gvisor/shim
  say "go build: $(since "$t2") s"
  mkdir -p "$K8S_BIN"
  mv "$out/runsc" "$K8S_BIN/runsc"
  mv "$out/shim" "$K8S_BIN/containerd-shim-runsc-v1"
  rmdir "$out"
  stamp "$line"
  say "gVisor built in $(since "$t") s"
}

# kube-router, for its network policy controller: up.sh runs nothing else
# of it. Its own go.mod decides the dependencies.
build_kube_router() {
  local line="kube-router $KUBE_ROUTER_VERSION"
  if stamped "$line" && have kube-router; then
    say "kube-router $KUBE_ROUTER_VERSION already built"
    return
  fi
  local t out=$K8S_CACHE/out-kube-router
  t=$(now)
  say "building kube-router $KUBE_ROUTER_VERSION"
  rm -rf "$out"; mkdir -p "$out"
  GOBIN=$out GOFLAGS=-buildvcs=false go install -trimpath -ldflags='-s -w' \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
  mkdir -p "$K8S_BIN"
  mv "$out/kube-router" "$K8S_BIN/kube-router"
  rmdir "$out"
  stamp "$line"
  say "kube-router built in $(since "$t") s"
}

main() {
  local t0; t0=$(now)
  command -v go >/dev/null || die "Go 1.26 or newer is needed at /usr/local/go"
  mkdir -p "$K8S_CACHE"
  packages
  go_env
  build_k8s
  build_gvisor
  build_kube_router
  pause_image >/dev/null
  say "build done in $(since "$t0") s: $K8S_BIN ($(du -sh "$K8S_CACHE" | cut -f1) in $K8S_CACHE)"
}

main "$@"
