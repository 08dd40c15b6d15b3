#!/usr/bin/env bash
# Runs every example against a built `boxoffice` binary, as the README tells a newcomer to run
# them, and fails if any step does not answer what the README says. `.ci/run` calls it after
# the tests; by hand:
#   cargo build --release && examples/run.sh                 # target/release/boxoffice
#   BOXOFFICE_BIN=path/to/boxoffice examples/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BOXOFFICE_BIN:-target/release/boxoffice}
[ -x "$bin" ] || { echo "examples/run.sh: no binary at $bin (cargo build --release)" >&2; exit 2; }
bin=$(realpath "$bin")
work=$(mktemp -d)
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# A free loopback port: bind port 0 and read back what the kernel gave.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The README pastes the walk-through's lines: they must be the lines this run checks.
python3 - <<'PY' || exit 1
import sys
script = open("examples/http-walkthrough.sh").read()
begin, end = "# --- README: try it (begin) ---\n", "# --- README: try it (end) ---"
block = script[script.index(begin) + len(begin):script.index(end)]
if block not in open("README.md").read():
    sys.exit("examples/run.sh: README.md's walk-through differs from examples/http-walkthrough.sh")
PY

# The README's "Run one node" with its HTTP port, then its "Try it" walk-through.
http=$(free_port)
"$bin" serve --http-listen "127.0.0.1:$http" --admin-key adm --client-key cli \
    --listen "127.0.0.1:$(free_port)" --metrics-listen "127.0.0.1:$(free_port)" \
    --data-dir "$work/data" >"$work/serve.log" 2>&1 &
server=$!
# Ready once it serves calls (up to a minute: a loaded CI machine starts slowly). The HTTP port
# answers its OpenAPI document while the log is still being replayed, and calls NOT_READY (503)
# then: a list of events answers 200 only once the engine serves.
ready=
for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$http/v1/events" -H 'Authorization: Bearer cli' -o /dev/null; then
        ready=1
        break
    fi
    sleep 0.2
done
[ -n "$ready" ] || { echo "examples/run.sh: the server did not start; its log:" >&2; cat "$work/serve.log" >&2; exit 1; }
(cd "$work" && BOXOFFICE_HTTP="http://127.0.0.1:$http" timeout 120 \
    "$OLDPWD/examples/http-walkthrough.sh") || {
    echo "examples/run.sh: http-walkthrough.sh failed; the server's log:" >&2
    cat "$work/serve.log" >&2
    exit 1
}
kill "$server" && wait "$server" 2>/dev/null || true
server=

# The README's local cluster: a hold through a follower survives kill -9 of the leader.
BOXOFFICE_BIN="$bin" timeout 300 examples/cluster.sh
echo "examples/run.sh: every example did what the README says"
