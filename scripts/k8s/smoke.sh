#!/usr/bin/env bash
# Checks a running test cluster (up.sh) end to end, as Corral's Kubernetes
# runtime will use it: in namespace corral-smoke, a hostPath PV + PVC (host
# dir mode 0777) and, per runtime given (default: runc gvisor), a batch/v1
# Job from the busybox image (image.sh busybox) running as uid 1000,
# runAsNonRoot, all capabilities dropped, no privilege escalation, seccomp
# RuntimeDefault, read-only root, cpu/memory limits, the PVC mounted with a
# subPath. The pod writes a file there and sends a line to a TCP listener
# on the host at the node IP. Prints the Job latency (create -> Complete).
# Run as root: smoke.sh [runc] [gvisor]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

runtimes=("$@")
[ ${#runtimes[@]} -gt 0 ] || runtimes=(runc gvisor)
ns=corral-smoke
dir=$(mktemp -d /tmp/corral-k8s-smoke.XXXXXX)
# A fresh PV name each run: the PV controller may still hold a deleted PV
# of the same name, and the claim then waits for its resync.
pv=corral-smoke-$(tr 'A-Z' 'a-z' <<<"${dir##*.}")
chmod 0777 "$dir"
listeners=()
cleanup() {
  local p
  for p in ${listeners[@]+"${listeners[@]}"}; do kill "$p" 2>/dev/null || true; done
  kubectl_ delete namespace "$ns" --ignore-not-found --wait=true >/dev/null 2>&1 || true
  kubectl_ delete pv "$pv" --ignore-not-found >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

pid_alive kubelet || die "no cluster running at $K8S_RUN (run up.sh)"
img=$K8S_BUSYBOX_IMAGE
"$K8S_LIB_DIR/import.sh" "$(busybox_image)" >/dev/null

kubectl_ delete namespace "$ns" --ignore-not-found --wait=true >/dev/null
kubectl_ create namespace "$ns" >/dev/null
# A new namespace gets its default ServiceAccount from the controller
# manager a moment later; pods are refused until then.
for _ in $(seq 1 50); do
  kubectl_ -n "$ns" get serviceaccount default >/dev/null 2>&1 && break
  sleep 0.1
done
kubectl_ apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $pv
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: corral-smoke
  hostPath: {path: $dir, type: Directory}
EOF
# The PV controller binds a claim at once only if it has seen the volume;
# a claim it sees first waits for its next resync (15 s).
wait_phase() {
  local what=$1 want=$2 t phase=""
  t=$(now)
  for _ in $(seq 1 300); do
    # shellcheck disable=SC2086 # WHAT is several words
    phase=$(kubectl_ get $what -o jsonpath='{.status.phase}' 2>/dev/null || true)
    [ "$phase" = "$want" ] && { say "$what $want after $(since "$t") s"; return; }
    sleep 0.1
  done
  die "$what is ${phase:-missing}, not $want, after 30 s"
}
wait_phase "pv $pv" Available
kubectl_ apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: work
  namespace: $ns
spec:
  accessModes: [ReadWriteMany]
  storageClassName: corral-smoke
  volumeName: $pv
  resources: {requests: {storage: 1Gi}}
EOF
wait_phase "-n $ns pvc work" Bound

port=18080
for rt in "${runtimes[@]}"; do
  case "$rt" in
    runc) rc="" ;;
    gvisor) rc="runtimeClassName: $K8S_RUNTIME_CLASS" ;;
    *) die "unknown runtime $rt (runc or gvisor)" ;;
  esac
  port=$((port + 1))
  # The host side: busybox nc takes one connection (its nc cannot bind one
  # address; the pod connects to the node IP).
  setsid busybox nc -l -p "$port" >"$dir/$rt.net" 2>&1 </dev/null &
  listeners+=($!)
  t=$(now)
  kubectl_ apply -f - >/dev/null <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: smoke-$rt
  namespace: $ns
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      $rc
      automountServiceAccountToken: false
      securityContext:
        runAsUser: 1000
        runAsGroup: 1000
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: work
        image: $img
        imagePullPolicy: Never
        command:
        - sh
        - -c
        - |
          set -e
          {
            echo "runtime $rt"
            id
            grep CapEff /proc/self/status
            echo "kernel \$(uname -r)"
            echo "mem limit \$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || echo ?)"
            echo "MemTotal \$(grep MemTotal /proc/meminfo)"
            touch /probe-ro 2>/dev/null && echo "root fs writable" || echo "root fs read-only"
          } | tee /out/result
          echo "hello from the $rt pod \$(hostname)" | nc -w 5 $K8S_NODE_IP $port
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        resources:
          requests: {cpu: 100m, memory: 64Mi}
          limits: {cpu: 500m, memory: 128Mi}
        volumeMounts:
        - {name: work, mountPath: /out, subPath: $rt}
        - {name: tmp, mountPath: /tmp}
      volumes:
      - name: work
        persistentVolumeClaim: {claimName: work}
      - name: tmp
        emptyDir: {}
EOF
  status=""
  for _ in $(seq 1 600); do
    status=$(kubectl_ -n "$ns" get job "smoke-$rt" -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}')
    case "$status" in *Complete* | *Failed*) break ;; esac
    sleep 0.1
  done
  latency=$(since "$t")
  if [[ $status != *Complete* ]]; then
    kubectl_ -n "$ns" describe job,pod >&2 || true
    kubectl_ -n "$ns" logs "job/smoke-$rt" >&2 || true
    die "Job smoke-$rt did not complete (conditions: ${status:-none})"
  fi
  say "Job smoke-$rt Complete $latency s after create"
  echo "--- kubectl logs job/smoke-$rt:"
  kubectl_ -n "$ns" logs "job/smoke-$rt"
  echo "--- on the host: $(stat -c '%U(%u) %a' "$dir/$rt/result") $dir/$rt/result; the listener got:"
  cat "$dir/$rt.net"
  grep -q "hello from the $rt pod" "$dir/$rt.net" || die "the host listener got nothing from the $rt pod"
  [ "$(stat -c %u "$dir/$rt/result")" = 1000 ] || die "$dir/$rt/result is not owned by uid 1000"
done
say "smoke test passed: ${runtimes[*]}"
