#!/usr/bin/env bash
# Sets up what is missing, builds Corral, starts the server on the embedded
# default (SQLite, the local bubblewrap runtime) and runs a sample task: a
# command worker that reads a CSV from shared/data and writes a report to
# output/. The server keeps running afterwards; the script says how to stop it.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/local/go/bin"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

if ! command -v bwrap >/dev/null; then
  echo "==> installing bubblewrap"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq bubblewrap >/dev/null
fi
command -v go >/dev/null || { echo "Go 1.26 or newer is needed: https://go.dev/dl/" >&2; exit 1; }

echo "==> building bin/corral and bin/corral-worker (what sandboxes run)"
CGO_ENABLED=0 go build -o bin/ ./cmd/corral ./cmd/corral-worker

data=./corral-data
# As root, sandboxes run as the reserved host identity 1900000000, which
# must be able to pass through the data root's parents (a checkout under
# /root, mode 0700, is closed to it): then the data goes to /var/lib/corral.
if [ "$(id -u)" = 0 ] && ! setpriv --reuid=1900000000 --regid=1900000000 --clear-groups test -x "$PWD"; then
  data=/var/lib/corral
  echo "==> $PWD is closed to the sandbox identity; keeping the data in $data"
fi
mkdir -p "$data"
url=http://127.0.0.1:7777
up() { bin/corral tasks --limit 1 >/dev/null 2>&1; }
if up; then
  echo "==> a server already answers at $url; using it"
else
  echo "==> starting the server (log: $data/serve.log)"
  # Sandboxes need root for cgroup limits; without root they run without them.
  $sudo nohup bin/corral serve --data "$data" >"$data/serve.log" 2>&1 &
  echo $! >"$data/serve.pid"
  for _ in $(seq 100); do
    up && break
    sleep 0.1
  done
  up || { echo "the server did not start:" >&2; cat "$data/serve.log" >&2; exit 1; }
fi

echo "==> bin/corral doctor (the sample task runs a command worker: an agent without credentials does not stop it)"
bin/corral doctor | sed 's/^/    /' || true

echo "==> putting a sample bank statement in shared/data/transactions.csv"
bin/corral ws put data/transactions.csv <<'CSV'
date,description,category,amount
2026-10-01,Corner Grocery,food,54.20
2026-10-02,City Rent,housing,1200.00
2026-10-03,Bus pass,transport,45.00
2026-10-05,Corner Grocery,food,38.75
2026-10-09,Power & Light,utilities,82.10
2026-10-12,Noodle Bar,food,23.40
2026-10-15,Train ticket,transport,19.90
2026-10-20,Water Co,utilities,31.00
CSV

echo "==> running a sample task with the command agent"
bin/corral run --follow --context data/transactions.csv \
  "Summarise the spending in transactions.csv by category into output/report.md" \
  -- sh -c '
    {
      echo "# Spending by category"
      echo
      echo "| category | total |"
      echo "|---|---:|"
      awk -F, "NR>1 { t[\$3] += \$4 } END { for (c in t) printf \"| %s | %.2f |\n\", c, t[c] }" context/transactions.csv | sort
    } > output/report.md
    cat output/report.md'

cat <<MSG

The server is still running at $url (data in $data).
Try:   bin/corral tasks      bin/corral ws ls      bin/corral --help
Stop:  $sudo kill \$(cat $data/serve.pid)
MSG
