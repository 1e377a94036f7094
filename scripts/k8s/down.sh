#!/usr/bin/env bash
# Stops the single-node cluster up.sh started and puts the host back:
# deletes the workloads through the API first (so the kubelet unmounts their
# volumes and CNI DEL runs), stops the kubelet, the containers and their
# shims, containerd, the control plane and kube-router (all by pid file),
# removes kube-router's iptables chains and ipsets, unmounts what
# is left under $K8S_RUN, removes the CRI network namespaces, the bridge, the
# kubepods cgroups, the host directories up.sh created, restores the sysctls
# the kubelet changed and removes $K8S_RUN. The build cache stays.
# Run as root; safe to run again, or on a half-started cluster.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

R=$K8S_RUN
t0=$(now)

remove_bridge() {
  if ip link show "$K8S_BRIDGE" >/dev/null 2>&1; then
    ip link del "$K8S_BRIDGE"
  fi
}

if [ ! -d "$R" ]; then
  remove_bridge
  say "no cluster at $R"
  exit 0
fi

# kill_pids PID...: SIGKILL, then wait (up to 5 s) until they are gone.
kill_pids() {
  [ $# -gt 0 ] || return 0
  kill -KILL "$@" 2>/dev/null || true
  local p alive
  for _ in $(seq 1 50); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return
    sleep 0.1
  done
}

# leftovers [all]: pids of this cluster's processes still running: the
# daemons, shims and runsc (sandbox, gofer) whose command line names the run
# dir, and what is in a kubepods cgroup (containers). With "all", any
# process naming the run dir (e.g. a kubectl a user left running).
leftovers() {
  local p cmd
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] && continue
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in *"$R/"*) ;; *) continue ;; esac
    case "$(basename "$(readlink "/proc/$p/exe" 2>/dev/null)")" in
      containerd | containerd-shim-* | runsc | runc | etcd | kube-* | kubelet) echo "$p" ;;
      *) [ "${1:-}" = all ] && echo "$p" ;;
    esac
  done
  find /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null || true
} 2>/dev/null

# 1. Workloads, through the API, while the kubelet still runs.
if pid_alive kube-apiserver && api /readyz >/dev/null 2>&1; then
  t=$(now)
  # Controllers first, orphaning their pods: with the default cascade the
  # garbage collector deletes the pods with their own grace period (30 s)
  # and the kubelet's stop, once begun, does not shorten to ours.
  kubectl_ delete jobs,cronjobs,deployments,replicasets,statefulsets,daemonsets,replicationcontrollers \
    --all --all-namespaces --cascade=orphan --wait=false >/dev/null 2>&1 || true
  kubectl_ delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1 || true
  if pid_alive kubelet; then
    for _ in $(seq 1 300); do
      api /api/v1/pods?limit=1 | tr -d ' \n' | grep -q '"items":\[\]' && break
      sleep 0.2
    done
    api /api/v1/pods?limit=1 | tr -d ' \n' | grep -q '"items":\[\]' ||
      warn "pods still listed after 60 s; going on"
  fi
  say "workloads deleted in $(since "$t") s"
fi

# 2. The kubelet and the controllers.
t=$(now)
stop_daemons kube-router kubelet kube-controller-manager kube-scheduler
say "kube-router, kubelet, controller manager, scheduler stopped in $(since "$t") s"

# 3. Containers still running (e.g. when the API was gone), containerd and
#    the control plane.
t=$(now)
if pid_alive containerd; then
  for id in $(ctr_ tasks ls -q 2>/dev/null); do
    ctr_ tasks delete --force "$id" >/dev/null 2>&1 || true
  done
fi
# containerd and the apiserver stop together; etcd after the apiserver.
stop_daemons containerd kube-apiserver
stop_daemons etcd
say "containers, containerd, apiserver, etcd stopped in $(since "$t") s"
# Shims, runsc sandboxes and container processes that outlived containerd.
mapfile -t pids < <(leftovers | sort -u)
if [ ${#pids[@]} -gt 0 ]; then
  say "killing leftover processes ${pids[*]}"
  kill_pids "${pids[@]}"
fi

# 4. Mounts under the run dir (container rootfs, volumes, subPaths, the
#    kubelet's own bind mount), deepest first, and the CRI network namespaces.
for _ in 1 2 3 4 5; do
  mapfile -t mnts < <(findmnt -rn -o TARGET | grep -F "$R/" | sort -r -u)
  [ ${#mnts[@]} -gt 0 ] || break
  for m in "${mnts[@]}"; do
    m=$(printf '%b' "$m")  # findmnt -r writes a space as \x20
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
done
for ns in /run/netns/cni-*; do
  [ -e "$ns" ] || continue
  grep -qxF "${ns##*/}" "$R/host/netns-before" 2>/dev/null && continue
  umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
  rm -f "$ns"
done

# 5. The bridge.
remove_bridge

# 6. The kubelet's cgroups (cgroup v1 hierarchies and the v2 one).
for cg in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
  [ -d "$cg" ] || continue
  find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
  [ ! -d "$cg" ] || warn "could not remove $cg"
done

# 7. Host directories up.sh found missing and something of the run created.
created=$(cat "$R/host/created-dirs" 2>/dev/null || true)
if grep -qxF /var/log/containers <<<"$created"; then
  rm -rf /var/log/containers
elif [ -d /var/log/containers ]; then
  # Only the kubelet's symlinks into this run's pod logs.
  find /var/log/containers -maxdepth 1 -type l -lname "$R/*" -delete
fi
for d in /var/lib/kubelet /var/lib/cni; do
  if grep -qxF "$d" <<<"$created"; then
    rm -rf --one-file-system "$d"
  fi
done
# libcni's cache of this network's results, where /var/lib/cni was there before.
rm -f /var/lib/cni/results/corral-*
for d in /run/netns /run/containerd/s /run/containerd; do
  if grep -qxF "$d" <<<"$created" && [ -d "$d" ]; then
    rmdir "$d" 2>/dev/null || warn "$d is not empty, left in place"
  fi
done

# 8. The kubelet's iptables chains, if it made any and there were none before.
for ipt in $(cat "$R/host/iptables-clean" 2>/dev/null); do
  for table in filter nat mangle; do
    $ipt -t $table -X KUBE-KUBELET-CANARY 2>/dev/null || true
  done
  if $ipt -S KUBE-FIREWALL >/dev/null 2>&1; then
    while $ipt -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while $ipt -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    $ipt -F KUBE-FIREWALL && $ipt -X KUBE-FIREWALL
  fi
done

# 8b. kube-router's chains (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*),
#     with the rules that jump to them, and its ipsets; it leaves them when
#     it stops. up.sh refused to start next to chains of another.
if [ -f "$R/host/kube-router" ]; then
  if iptables-save -t filter | grep -qE 'KUBE-(ROUTER-|POD-FW-|NWPLCY-)'; then
    iptables-save -t filter | grep -vE 'KUBE-(ROUTER-|POD-FW-|NWPLCY-)' | iptables-restore -T filter ||
      warn "could not remove kube-router's iptables chains"
  fi
  for set in $(ipset list -n 2>/dev/null | grep '^KUBE-' || true); do
    grep -qxF "$set" "$R/host/ipsets-before" 2>/dev/null && continue
    ipset destroy "$set" 2>/dev/null || warn "could not remove ipset $set"
  done
fi

# 9. The sysctls the kubelet changed.
restored=()
while IFS='=' read -r key val; do
  [ -n "$key" ] || continue
  if [ "$(sysctl -n "$key" 2>/dev/null)" != "$val" ]; then
    sysctl -q -w "$key=$val" && restored+=("$key=$val")
  fi
done <"$R/host/sysctls" 2>/dev/null || true
[ ${#restored[@]} -eq 0 ] || say "restored ${restored[*]}"

# 10. Check, then remove the run dir (never through a mount: a subPath bind
#     mount would lead rm into a volume's host directory).
mapfile -t pids < <(leftovers all | sort -u)
[ ${#pids[@]} -eq 0 ] || die "processes still running: ${pids[*]}; $R left in place"
if findmnt -rn -o TARGET | grep -qF "$R/"; then
  die "mounts remain under $R: $(findmnt -rn -o TARGET | grep -F "$R/" | tr '\n' ' ')"
fi
rm -rf --one-file-system "$R"
say "cluster down in $(since "$t0") s"
