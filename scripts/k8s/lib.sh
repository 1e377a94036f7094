# shellcheck shell=bash disable=SC2034
# Shared settings and helpers of the single-node test cluster scripts in
# scripts/k8s (build.sh, image.sh, up.sh, import.sh, down.sh). Sourced, not
# run. Everything a script builds lives in $K8S_CACHE (outside the checkout,
# reused by later runs on the same machine); everything one cluster run
# creates lives in $K8S_RUN, which down.sh removes.

# Pinned versions. The build stamp ($K8S_CACHE/versions) records them, so
# changing one here makes build.sh rebuild that part.
K8S_VERSION=v1.34.10
ETCD_VERSION=v3.6.4
# The newest gVisor whose containerd shim still speaks containerd 1.6's shim
# protocol (Debian 12 ships containerd 1.6.20); newer shims use the v2
# bootstrap protocol containerd 1.6 cannot parse.
GVISOR_VERSION=v0.0.0-20250503011706-39ed1f5ac29c
# Bump when the local gVisor patch (build.sh) changes.
GVISOR_PATCH=oom-eacces-1
# The node's NetworkPolicy enforcement: kube-router's network policy
# controller alone (iptables and ipsets). The newest the module proxy
# serves; it runs on the test node only, never beside Corral.
KUBE_ROUTER_VERSION=v2.1.0

K8S_CACHE=${CORRAL_TEST_CACHE:-/var/cache/corral-test}/k8s
K8S_BIN=$K8S_CACHE/bin
K8S_IMAGES_DIR=$K8S_CACHE/images
# Short on purpose: containerd's socket path must stay under 108 bytes.
K8S_RUN=${K8S_RUN:-/run/corral-k8s}
K8S_KUBECONFIG=$K8S_RUN/kubeconfig
K8S_CTRD_SOCK=$K8S_RUN/containerd.sock

# The node: a bridge of our own (not docker's), its address is the node IP,
# the kubelet's listen address and what pods reach the host at.
K8S_BRIDGE=corralk8s0
K8S_NODE_IP=10.88.0.1
K8S_POD_CIDR=10.88.0.0/24
K8S_SERVICE_CIDR=10.0.0.0/24
K8S_NODE_NAME=corral-node
K8S_RUNTIME_CLASS=gvisor
K8S_PAUSE_IMAGE=localhost/corral-pause:1
K8S_BUSYBOX_IMAGE=localhost/corral-busybox:1
K8S_CLAUDE_IMAGE=localhost/corral-claude:1

# The binaries build.sh makes; up.sh needs all of them.
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd runsc containerd-shim-runsc-v1 kube-router)

# The sysctls the kubelet sets at start (setupKernelTunables) and the one a
# CNI gateway would; up.sh saves them, down.sh puts them back.
K8S_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.bridge.bridge-nf-call-iptables)

export PATH="$PATH:/usr/local/go/bin"

K8S_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { echo "==> $*"; }
warn() { echo "==> WARNING: $*" >&2; }
die() { echo "==> ERROR: $*" >&2; exit 1; }

# now prints the time in seconds (with microseconds); since T prints the
# seconds elapsed since T, e.g. "4.21".
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

need_root() {
  [ "$(id -u)" = 0 ] || die "$(basename "$0") must run as root (it starts a kubelet and containerd)"
}

# pid_alive NAME: the daemon NAME started by up.sh is running.
pid_alive() {
  local f=$K8S_RUN/pid/$1.pid pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  # The pid must still be the program we started, not a recycled pid.
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(cat "$K8S_RUN/pid/$1.exe" 2>/dev/null)" ]
}

# start_daemon NAME PROGRAM ARGS...: runs PROGRAM in its own session (so it
# outlives the calling shell and its terminal), output to $K8S_RUN/log/NAME.log,
# pid in $K8S_RUN/pid/NAME.pid.
start_daemon() {
  local name=$1; shift
  mkdir -p "$K8S_RUN/log" "$K8S_RUN/pid"
  # In a non-interactive shell a background job is no process group leader,
  # so setsid execs PROGRAM in place and $! is PROGRAM's pid.
  setsid "$@" </dev/null >>"$K8S_RUN/log/$name.log" 2>&1 &
  echo $! >"$K8S_RUN/pid/$name.pid"
  readlink -f "$(command -v "$1")" >"$K8S_RUN/pid/$name.exe"
}

# stop_daemons NAME...: SIGTERM to each, then waits up to 10 s for all of
# them and SIGKILLs what is left. Removes the pid files.
stop_daemons() {
  local name pids=() pid i
  for name in "$@"; do
    if pid_alive "$name"; then
      pid=$(cat "$K8S_RUN/pid/$name.pid")
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for i in $(seq 1 100); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      warn "pid $pid ignored SIGTERM for 10 s, killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for name in "$@"; do rm -f "$K8S_RUN/pid/$name.pid" "$K8S_RUN/pid/$name.exe"; done
}

kubectl_() { "$K8S_BIN/kubectl" --kubeconfig "$K8S_KUBECONFIG" "$@"; }
ctr_() { ctr --address "$K8S_CTRD_SOCK" --namespace k8s.io "$@"; }

# api PATH: GET on the apiserver with the admin token, body on stdout.
api() {
  curl -sfk --max-time 2 -H "Authorization: Bearer $(cat "$K8S_RUN/pki/admin-token")" "https://$K8S_NODE_IP:6443$1"
}

# image_names TARBALL: the RepoTags of a docker-archive tarball, one a line.
image_names() {
  tar -xOf "$1" manifest.json | grep -o '"RepoTags":\[[^]]*\]' | grep -o '"[^"]*"' | grep -v RepoTags | tr -d '"'
}

# import_images TARBALL...: imports docker-archive tarballs into the
# running node's containerd, namespace k8s.io, where the kubelet finds them.
import_images() {
  local tar
  for tar in "$@"; do
    [ -s "$tar" ] || die "no image tarball $tar"
    ctr_ images import --all-platforms --snapshotter overlayfs "$tar" >/dev/null ||
      die "ctr images import $tar failed"
    say "imported $(image_names "$tar" | tr '\n' ' ')($tar)"
  done
}

# json_str S: S as a JSON string.
json_str() {
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}
  printf '"%s"' "$s"
}

# image_name NAME:TAG: NAME:TAG as containerd and the kubelet will call it.
# A name without a host part gets "localhost/", so the runtime never reads it
# as a name on a remote registry.
image_name() {
  local name=$1 first
  case "${name##*/}" in *:*) ;; *) die "image name $name has no :TAG" ;; esac
  first=${name%%/*}
  if [ "$first" = "$name" ] || { [ "$first" != localhost ] && [[ $first != *.* ]] && [[ $first != *:* ]]; }; then
    name=localhost/$name
  fi
  echo "$name"
}

# mkimage NAME:TAG ROOTFS OUT.tar [ENTRYPOINT_JSON [CMD_JSON [USER [WORKDIR [ENV...]]]]]
# Writes OUT.tar, a single-layer docker-archive of ROOTFS (a directory, or
# a tarball: plain, gzip, xz or zstd) that `ctr images import` accepts.
# ENTRYPOINT_JSON and CMD_JSON are JSON arrays (or empty); ENV are extra
# KEY=VALUE entries after the default PATH.
mkimage() {
  local name src=$2 out=$3 entry=${4:-} cmd=${5:-} user=${6:-} workdir=${7:-/}
  name=$(image_name "$1")
  shift 7 2>/dev/null || shift $#
  local arch
  case "$(uname -m)" in
    x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;;
  esac
  mkdir -p "$(dirname "$out")"
  local tmp
  tmp=$(mktemp -d "$(dirname "$out")/.mkimage.XXXXXX")
  if [ -d "$src" ]; then
    # Entries named "bin", "etc/passwd", ... (no "./"), sorted, numeric owners.
    (cd "$src" && find . -mindepth 1 -maxdepth 1 -printf '%P\0' | LC_ALL=C sort -z) |
      tar -C "$src" --sort=name --numeric-owner --null -T - -cf "$tmp/layer.tar"
  elif [ -f "$src" ]; then
    case "$(head -c 4 "$src" | od -An -tx1 | tr -d ' \n')" in
      1f8b*) gzip -dc "$src" >"$tmp/layer.tar" ;;
      fd377a58) xz -dc "$src" >"$tmp/layer.tar" ;;
      28b52ffd) zstd -qdc "$src" >"$tmp/layer.tar" ;;
      *) cp "$src" "$tmp/layer.tar" ;;
    esac
  else
    rm -rf "$tmp"; die "root file system $src is neither a directory nor a file"
  fi
  local diff cfg env e
  diff=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
  mkdir "$tmp/$diff"
  mv "$tmp/layer.tar" "$tmp/$diff/layer.tar"
  env='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
  for e in "$@"; do env+=",$(json_str "$e")"; done
  {
    printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z",' "$arch"
    printf '"config":{"Env":[%s],"WorkingDir":%s' "$env" "$(json_str "$workdir")"
    [ -n "$user" ] && printf ',"User":%s' "$(json_str "$user")"
    [ -n "$entry" ] && printf ',"Entrypoint":%s' "$entry"
    [ -n "$cmd" ] && printf ',"Cmd":%s' "$cmd"
    printf '},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},' "$diff"
    printf '"history":[{"created":"1970-01-01T00:00:00Z","created_by":"corral scripts/k8s/image.sh"}]}'
  } >"$tmp/config.json"
  cfg=$(sha256sum "$tmp/config.json" | cut -d' ' -f1)
  mv "$tmp/config.json" "$tmp/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":[%s],"Layers":["%s/layer.tar"]}]\n' \
    "$cfg" "$(json_str "$name")" "$diff" >"$tmp/manifest.json"
  tar -C "$tmp" -cf "$out.tmp" manifest.json "$cfg.json" "$diff"
  mv "$out.tmp" "$out"
  rm -rf "$tmp"
}

# pause_image: builds (once per source change) the sandbox image from
# pause.go into $K8S_IMAGES_DIR/pause.tar and prints its path.
pause_image() {
  local out=$K8S_IMAGES_DIR/pause.tar src=$K8S_LIB_DIR/pause.go sum
  sum=$(sha256sum <"$src" | cut -d' ' -f1)
  if [ -s "$out" ] && [ "$(cat "$out.sum" 2>/dev/null)" = "$sum" ]; then
    echo "$out"; return
  fi
  say "building the pause image $K8S_PAUSE_IMAGE" >&2
  local mod=$K8S_CACHE/src/pause root
  rm -rf "$mod"; mkdir -p "$mod"
  cp "$src" "$mod/main.go"
  sed -i '/^\/\/go:build ignore$/d' "$mod/main.go"
  printf 'module corralpause\n\ngo 1.24\n' >"$mod/go.mod"
  root=$(mktemp -d)
  (cd "$mod" && GOWORK=off GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
    GOCACHE=$K8S_CACHE/gocache GOMODCACHE=$K8S_CACHE/gomod \
    go build -trimpath -ldflags='-s -w' -o "$root/pause" .) || { rm -rf "$root"; die "building pause failed"; }
  mkimage "$K8S_PAUSE_IMAGE" "$root" "$out" '["/pause"]' "" "65535:65535"
  rm -rf "$root"
  echo "$sum" >"$out.sum"
  echo "$out"
}

# busybox_image [NAME:TAG [OUT.tar]]: an image of Debian's static busybox
# (all applets linked in /bin), /etc/passwd and /etc/group with root, a
# uid 1000 user "worker" (home /home/worker) and nobody, /tmp mode 1777.
# Default $K8S_BUSYBOX_IMAGE into $K8S_IMAGES_DIR/busybox.tar; prints the path.
busybox_image() {
  local name=${1:-$K8S_BUSYBOX_IMAGE} out=${2:-$K8S_IMAGES_DIR/busybox.tar}
  local bb
  bb=$(dpkg -L busybox-static 2>/dev/null | grep -m1 '/bin/busybox$') ||
    die "busybox-static is not installed (apt-get install busybox-static)"
  if [ -s "$out" ] && [ "$out" -nt "$bb" ] && [ "$out" -nt "$K8S_LIB_DIR/lib.sh" ] &&
    [ "$(image_names "$out")" = "$(image_name "$name")" ]; then
    echo "$out"; return
  fi
  say "building the image $(image_name "$name") from $bb" >&2
  local root
  root=$(mktemp -d)
  busybox_root "$root"
  mkimage "$name" "$root" "$out" "" '["/bin/sh"]'
  rm -rf "$root"
  echo "$out"
}

# busybox_root DIR: fills the empty directory DIR with busybox_image's root
# file system, for an image that adds to it (the server's, in
# internal/k8srender's replicas test).
busybox_root() {
  local root=$1 bb app
  bb=$(dpkg -L busybox-static 2>/dev/null | grep -m1 '/bin/busybox$') ||
    die "busybox-static is not installed (apt-get install busybox-static)"
  chmod 755 "$root"
  mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/root" "$root/home/worker"
  cp "$bb" "$root/bin/busybox"
  for app in $("$bb" --list); do
    [ "$app" = busybox ] || ln -s busybox "$root/bin/$app"
  done
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'worker:x:1000:1000:worker:/home/worker:/bin/sh' \
    'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'worker:x:1000:' 'nogroup:x:65534:' >"$root/etc/group"
  chmod 1777 "$root/tmp"
  chmod 700 "$root/root"
  chown 1000:1000 "$root/home/worker"
}

# claude_image [NAME:TAG [OUT.tar]]: seed 000's worker for the Claude Code
# tests: a Debian 12 minbase root file system (mmdebstrap, no recommends)
# with bash, python3, git and ca-certificates, the host's Claude Code binary (a
# self-contained executable that needs only glibc) as
# /usr/local/bin/claude, and a uid 1000 user "worker". The root file system
# is built once into $K8S_IMAGES_DIR/debian12-python3-git.tar; the image again
# when the binary changes. Default $K8S_CLAUDE_IMAGE into
# $K8S_IMAGES_DIR/claude.tar; prints the path.
claude_image() {
  local name=${1:-$K8S_CLAUDE_IMAGE} out=${2:-$K8S_IMAGES_DIR/claude.tar}
  local rootfs=$K8S_IMAGES_DIR/debian12-python3-git.tar claude
  claude=$(command -v claude) && claude=$(readlink -f "$claude") ||
    die "claude is not installed (scripts/test.sh installs it from scripts/agent-clis.txt)"
  # The npm package's entry point is a small launcher beside the binary.
  case "$claude" in *.exe) ;; *) claude=$(dirname "$claude")/claude.exe ;; esac
  [ -x "$claude" ] || die "no Claude Code executable at $claude"
  if [ -s "$out" ] && [ "$out" -nt "$claude" ] && [ "$out" -nt "$K8S_LIB_DIR/lib.sh" ] &&
    [ "$(image_names "$out")" = "$(image_name "$name")" ]; then
    echo "$out"; return
  fi
  if [ ! -s "$rootfs" ]; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
    say "building a Debian 12 root file system with python3 and git (cached in $rootfs)" >&2
    mkdir -p "$K8S_IMAGES_DIR"
    mmdebstrap --quiet --format=tar --variant=minbase --aptopt='APT::Install-Recommends "false"' \
      --include=bash,ca-certificates,git,python3 bookworm "$rootfs.tmp" >&2
    mv "$rootfs.tmp" "$rootfs"
  fi
  say "building the image $(image_name "$name") with $claude" >&2
  local root
  root=$(mktemp -d)
  tar -C "$root" -xf "$rootfs"
  install -m 0755 "$claude" "$root/usr/local/bin/claude"
  echo 'worker:x:1000:1000:worker:/home/worker:/bin/bash' >>"$root/etc/passwd"
  echo 'worker:x:1000:' >>"$root/etc/group"
  mkdir -p "$root/home/worker"
  chown 1000:1000 "$root/home/worker"
  mkimage "$name" "$root" "$out" "" '["/bin/bash"]'
  rm -rf "$root"
  echo "$out"
}
