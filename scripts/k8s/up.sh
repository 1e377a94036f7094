#!/usr/bin/env bash
# Starts a real single-node Kubernetes cluster on this machine, from what
# build.sh put in ${CORRAL_TEST_CACHE:-/var/cache/corral-test}/k8s/bin:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd
# (Debian's, with its own config and socket; runtimes runc and gVisor) and a
# kubelet; kube-router's network policy controller enforces NetworkPolicies.
# Run as root. Usage:
#
#   up.sh [IMAGE.tar...]     also imports these docker-archive tarballs
#                            (and those in $K8S_IMAGES, space separated)
#
# Everything of the run lives in $K8S_RUN (default /run/corral-k8s): pid
# files (pid/), logs (log/), configs, etcd's data, containerd's images, the
# kubelet's root. The admin kubeconfig is $K8S_RUN/kubeconfig. Pods get
# 10.88.0.x on the bridge corralk8s0 and reach the host at 10.88.0.1, the
# node IP; nothing is forwarded off the machine. RuntimeClass "gvisor" runs
# a pod under gVisor. down.sh stops it all and puts the host back.
#
# If the cluster is already up and healthy, up.sh only imports the given
# images and exits 0.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
trap 'echo "==> up.sh failed: logs in $K8S_RUN/log; scripts/k8s/down.sh cleans up" >&2' ERR

healthy() {
  local d
  for d in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-router; do
    pid_alive "$d" || return 1
  done
  api /readyz >/dev/null 2>&1 || return 1
  node_ready
}

node_ready() {
  api "/api/v1/nodes/$K8S_NODE_NAME" 2>/dev/null | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
}

# wait_for WHAT SECONDS LOG COMMAND...: polls COMMAND every 0.1 s; on timeout
# shows the end of LOG and fails.
wait_for() {
  local what=$1 secs=$2 log=$3; shift 3
  for _ in $(seq 1 $((secs * 10))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "--- last lines of $log:" >&2
  tail -n 30 "$log" >&2 || true
  die "$what not ready after $secs s (logs in $K8S_RUN/log; run down.sh to clean up)"
}

images=("$@")
# shellcheck disable=SC2206
[ -n "${K8S_IMAGES:-}" ] && images+=(${K8S_IMAGES})

for b in "${K8S_BINARIES[@]}"; do
  [ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b is missing: run scripts/k8s/build.sh first"
done
for b in containerd ctr runc /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback openssl curl ip; do
  command -v "$b" >/dev/null || die "$b is missing: run scripts/k8s/build.sh (as root) first"
done

if [ -d "$K8S_RUN" ]; then
  if healthy; then
    say "the cluster is already up (KUBECONFIG=$K8S_KUBECONFIG)"
    [ ${#images[@]} -eq 0 ] || import_images "${images[@]}"
    exit 0
  fi
  say "$K8S_RUN is left from a run that is not healthy: cleaning it up with down.sh"
  "$K8S_LIB_DIR/down.sh"
fi

# One such node per machine: its ports and its bridge must be free.
busy=$(ss -Hltn '( sport = :2379 or sport = :2380 or sport = :6443 or sport = :10248 or sport = :10250 or sport = :10257 or sport = :10259 )' | awk '{print $4}' | tr '\n' ' ')
[ -z "$busy" ] || die "ports already in use: $busy(another cluster on this machine?)"
! ip link show "$K8S_BRIDGE" >/dev/null 2>&1 || die "the bridge $K8S_BRIDGE exists already (another cluster? down.sh removes it)"

t0=$(now)
R=$K8S_RUN
mkdir -p "$R"/{pid,log,pki,etcd,cni/net.d,cni/ipam,containerd,kubelet,pod-logs,runsc,host}
chmod 700 "$R"

# What of the host this run touches, so down.sh undoes exactly that.
for s in "${K8S_SYSCTLS[@]}"; do
  v=$(sysctl -n "$s" 2>/dev/null) && echo "$s=$v"
done >"$R/host/sysctls"
# Host paths the node writes to whatever its config says: shim sockets
# (containerd 1.6), CRI netns, libcni's result cache, the kubelet's device
# plugin socket dir and container log symlinks.
for p in /run/containerd /run/containerd/s /run/netns /var/lib/cni /var/lib/kubelet /var/log/containers; do
  [ -e "$p" ] || echo "$p"
done >"$R/host/created-dirs"
for ns in /run/netns/cni-*; do
  if [ -e "$ns" ]; then echo "${ns##*/}"; fi
done >"$R/host/netns-before"
# The kubelet's iptables chains are off (makeIPTablesUtilChains: false);
# down.sh removes them anyway where none were there before.
for ipt in iptables ip6tables; do
  command -v $ipt >/dev/null || continue
  $ipt -S KUBE-FIREWALL >/dev/null 2>&1 || $ipt -S KUBE-KUBELET-CANARY >/dev/null 2>&1 || echo $ipt
done >"$R/host/iptables-clean"

# --- keys, certificates, kubeconfig -----------------------------------------
P=$R/pki
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token" >"$P/admin-token"
echo "$token,admin,admin,system:masters" >"$P/tokens.csv"
openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
# A CA for the kubelet's client side: the apiserver authenticates to the
# kubelet with a cert it signed, so nothing else (a pod included, which
# reaches 10.88.0.1:10250 too) can use the kubelet's API.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -subj /CN=corral-k8s-kubelet-client-ca -keyout "$P/ca.key" -out "$P/ca.crt" 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" -keyout "$P/apiserver-kubelet.key" 2>/dev/null |
  openssl x509 -req -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 3650 \
    -extfile <(echo extendedKeyUsage=clientAuth) -out "$P/apiserver-kubelet.crt" 2>/dev/null
cat >"$K8S_KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: corral
  cluster:
    server: https://$K8S_NODE_IP:6443
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: $token
contexts:
- name: corral
  context: {cluster: corral, user: admin}
current-context: corral
EOF
chmod 600 "$K8S_KUBECONFIG" "$P"/*.key

# --- the bridge and CNI -----------------------------------------------------
# A fixed MAC address: a bridge without one takes the lowest of its ports'
# and changes it as pods come and go, and the pods, which keep the node's
# old address in their ARP cache, then cannot reach 10.88.0.1 (the server's
# webhooks and egress) for up to ~30 s. Measured: 13 of 300 connections
# from a pod timed out while other pods churned.
ip link add "$K8S_BRIDGE" address 02:00:0a:58:00:01 type bridge
ip addr add "$K8S_NODE_IP/${K8S_POD_CIDR#*/}" dev "$K8S_BRIDGE"
ip link set "$K8S_BRIDGE" up
# bridge + host-local on our bridge, no gateway/masquerade: pods reach the
# host's own addresses via 10.88.0.1 and nothing beyond the machine.
cat >"$R/cni/net.d/10-corral.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "corral",
  "plugins": [{
    "type": "bridge",
    "bridge": "$K8S_BRIDGE",
    "isGateway": false,
    "ipMasq": false,
    "ipam": {
      "type": "host-local",
      "dataDir": "$R/cni/ipam",
      "ranges": [[{"subnet": "$K8S_POD_CIDR", "rangeStart": "10.88.0.10", "rangeEnd": "10.88.0.250", "gateway": "$K8S_NODE_IP"}]],
      "routes": [{"dst": "0.0.0.0/0", "gw": "$K8S_NODE_IP"}]
    }
  }]
}
EOF

# --- etcd and kube-apiserver (they start while the node is set up) ----------
# The apiserver listens on the node IP, where the kubernetes Service's
# endpoint is and pods reach it (unless a NetworkPolicy says otherwise).
start_daemon etcd "$K8S_BIN/etcd" --name corral --data-dir "$R/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster corral=http://127.0.0.1:2380 --unsafe-no-fsync=true --log-level=warn
start_daemon kube-apiserver "$K8S_BIN/kube-apiserver" \
  --etcd-servers=http://127.0.0.1:2379 --cert-dir="$P/apiserver" \
  --bind-address="$K8S_NODE_IP" --advertise-address="$K8S_NODE_IP" --secure-port=6443 \
  --service-cluster-ip-range="$K8S_SERVICE_CIDR" \
  --service-account-issuer="https://$K8S_NODE_IP:6443/" \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --token-auth-file="$P/tokens.csv" --authorization-mode=RBAC --allow-privileged=true \
  --kubelet-preferred-address-types=InternalIP \
  --kubelet-client-certificate="$P/apiserver-kubelet.crt" --kubelet-client-key="$P/apiserver-kubelet.key" \
  --profiling=false

# --- containerd -------------------------------------------------------------
cat >"$R/runsc.toml" <<EOF
binary_name = "$K8S_BIN/runsc"
root = "$R/runsc"
[runsc_config]
  platform = "systrap"
  # Apply a pod's seccomp profile inside gVisor's kernel too (runsc
  # ignores it otherwise): Corral's refuses ptrace, keyrings and user
  # namespaces there as under runc.
  oci-seccomp = "true"
EOF
cat >"$R/containerd.toml" <<EOF
version = 2
root = "$R/containerd/root"
state = "$R/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "$K8S_CTRD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$R/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$K8S_PAUSE_IMAGE"
  # root here cannot lower oom_score_adj (no CAP_SYS_RESOURCE on the test
  # VMs); the kubelet asks -998 for sandboxes, clamp to containerd's own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$R/runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$K8S_RUNTIME_CLASS]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$K8S_RUNTIME_CLASS.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$R/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$R/cni/net.d"
    max_conf_num = 1
EOF
# PATH: containerd finds containerd-shim-runsc-v1 in bin/, runc's shim in /usr/bin.
PATH="$K8S_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  start_daemon containerd "$(command -v containerd)" --config "$R/containerd.toml"
wait_for containerd 20 "$R/log/containerd.log" ctr --address "$K8S_CTRD_SOCK" version
t_ctrd=$(now)
import_images "$(pause_image)" ${images[@]+"${images[@]}"}
t_img=$(now)

# --- controllers ------------------------------------------------------------
wait_for kube-apiserver 60 "$R/log/kube-apiserver.log" api /readyz
t_api=$(now)
# The PV controller binds a claim made after its volume at its next sync:
# every 15 s by default, which each test's claim (k8stest.Claim) waited
# 9 s of on average; every second here.
start_daemon kube-controller-manager "$K8S_BIN/kube-controller-manager" \
  --kubeconfig="$K8S_KUBECONFIG" --leader-elect=false --bind-address=127.0.0.1 \
  --cluster-name=corral --controllers='*' --use-service-account-credentials=false \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/apiserver/apiserver.crt" \
  --pvclaimbinder-sync-period=1s --profiling=false
start_daemon kube-scheduler "$K8S_BIN/kube-scheduler" \
  --kubeconfig="$K8S_KUBECONFIG" --leader-elect=false --bind-address=127.0.0.1 --profiling=false

# --- kubelet ----------------------------------------------------------------
cat >"$R/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $K8S_NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$K8S_CTRD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
podLogsDir: $R/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
protectKernelDefaults: false
# No KUBE-FIREWALL / KUBE-KUBELET-CANARY iptables chains (no kube-proxy here).
makeIPTablesUtilChains: false
resolvConf: /etc/resolv.conf
EOF
start_daemon kubelet "$K8S_BIN/kubelet" --config="$R/kubelet.yaml" --kubeconfig="$K8S_KUBECONFIG" \
  --root-dir="$R/kubelet" --cert-dir="$P/kubelet" --hostname-override="$K8S_NODE_NAME" --node-ip="$K8S_NODE_IP"
t_kubelet=$(now)
wait_for "node $K8S_NODE_NAME" 60 "$R/log/kubelet.log" node_ready
t_ready=$(now)
wait_for "the default ServiceAccount" 30 "$R/log/kube-controller-manager.log" \
  api /api/v1/namespaces/default/serviceaccounts/default

# --- NetworkPolicy ----------------------------------------------------------
# kube-router's network policy controller and nothing else of it (no
# routing, no service proxy, no CNI): iptables rules and ipsets that hold a
# pod a NetworkPolicy selects to it, on traffic between pods across the
# bridge (br_netfilter), traffic the node forwards and traffic from a pod to
# the node itself. A pod is held to its policies once the controller has
# seen its address: its first packets may come before (no CNI hook here).
# down.sh removes the chains and sets it leaves.
iptables -S KUBE-ROUTER-FORWARD >/dev/null 2>&1 && die "iptables chain KUBE-ROUTER-FORWARD exists already (another kube-router on this machine?)"
ipset list -n 2>/dev/null | grep '^KUBE-' >"$R/host/ipsets-before" || true
sysctl -q -w net.bridge.bridge-nf-call-iptables=1
: >"$R/host/kube-router"
start_daemon kube-router "$K8S_BIN/kube-router" --kubeconfig="$K8S_KUBECONFIG" \
  --hostname-override="$K8S_NODE_NAME" --run-firewall=true --run-router=false \
  --run-service-proxy=false --run-loadbalancer=false --enable-cni=false \
  --service-cluster-ip-range="$K8S_SERVICE_CIDR" --health-port=0 --metrics-port=0
wait_for kube-router 30 "$R/log/kube-router.log" iptables -S KUBE-ROUTER-FORWARD

kubectl_ apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: $K8S_RUNTIME_CLASS
handler: $K8S_RUNTIME_CLASS
EOF

say "cluster up in $(since "$t0") s (apiserver ready +$(awk -v a="$t0" -v b="$t_api" 'BEGIN{printf "%.1f", b-a}') s, containerd +$(awk -v a="$t0" -v b="$t_ctrd" 'BEGIN{printf "%.1f", b-a}') s, images $(awk -v a="$t_ctrd" -v b="$t_img" 'BEGIN{printf "%.1f", b-a}') s, node Ready $(awk -v a="$t_kubelet" -v b="$t_ready" 'BEGIN{printf "%.1f", b-a}') s after kubelet start)"
say "KUBECONFIG=$K8S_KUBECONFIG node $K8S_NODE_NAME ($K8S_NODE_IP) RuntimeClass $K8S_RUNTIME_CLASS; logs in $R/log"
