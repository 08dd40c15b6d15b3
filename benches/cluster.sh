#!/usr/bin/env bash
# One node against three, in one run on this machine with the same client (issue 13, point 7):
#   1. one `serve` (the embedded default: one process, its own fsynced log), `loadgen` against it;
#   2. three `serve --node-id` processes on loopback (one group), `loadgen` against the leader,
#      then against a follower (every call forwarded to the leader), then over 6 events;
#   3. the same three with `--groups 3` (each node leads a group), `loadgen` over 6 events;
#   after each, the leader's group-commit figures from /metrics: records per log append (one
#   group commit, which in a cluster is one Raft entry) and Raft entries appended.
#
#   benches/cluster.sh [REQUESTS [CONCURRENCY]]     (defaults: 40000 64)
#   BENCH_PEER_TLS=1 benches/cluster.sh ...         the nodes on peer ports over mutual TLS
#                                                   (certificates from `boxoffice cluster certs`)
#
# Uses target/release/boxoffice (built first). Data in a temp dir, removed at the end; every
# server binds 127.0.0.1 and is stopped on exit. Failover time over N kills comes from the
# multi-process test instead: BOXOFFICE_CLUSTER_KILLS=20 cargo test --release -p boxoffice \
#   --test cluster -- --nocapture
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${1:-40000}
CONCURRENCY=${2:-64}
cargo build --release -q -p boxoffice
BIN=$PWD/target/release/boxoffice
DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
KEYS=(--admin-key adm-bench-key --client-key cli-bench-key --token-secret tok-bench-secret-0123456789)
echo "cluster-bench-secret-0123456789abcdef" > "$DIR/secret"

# A free loopback port (asked of the kernel, then released).
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_serving() { # $1: log file
  for _ in $(seq 1 600); do
    grep -q "ready: serving" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "no 'ready: serving' in $1" >&2; cat "$1" >&2; exit 1
}

metric() { # $1: metrics address, $2: metric name (summed over labels)
  curl -s "http://$1/metrics" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%.0f", s }'
}

snap() { # $1: metrics address: records, appends and Raft index so far
  echo "$(metric "$1" boxoffice_wal_batch_records_sum) $(metric "$1" boxoffice_wal_batch_records_count) $(metric "$1" boxoffice_raft_last_log_index)"
}

figures() { # $1: metrics address of the node that served the engine, $2: its `snap` before
  local r0 b0 i0 r1 b1 i1
  read -r r0 b0 i0 <<< "$2"
  read -r r1 b1 i1 <<< "$(snap "$1")"
  echo "  group commits (log appends): $((b1 - b0)), records: $((r1 - r0)), records per append: $(awk -v r="$((r1 - r0))" -v b="$((b1 - b0))" 'BEGIN { if (b > 0) printf "%.1f", r / b; else print "n/a" }')"
  if [ "$i1" != "0" ]; then echo "  Raft entries appended: $((i1 - i0))"; fi
}

run_loadgen() { # $1: target port, $2: events (default 1)
  "$BIN" loadgen --target "http://127.0.0.1:$1" --requests "$REQUESTS" --concurrency "$CONCURRENCY" \
    --events "${2:-1}" --admin-key adm-bench-key --client-key cli-bench-key
}

echo "== 1 node (serve, fsync per group commit), loadgen --requests $REQUESTS --concurrency $CONCURRENCY"
P=$(port); M=$(port)
"$BIN" serve --listen "127.0.0.1:$P" --metrics-listen "127.0.0.1:$M" --data-dir "$DIR/single" \
  "${KEYS[@]}" > "$DIR/single.log" 2>&1 &
PIDS+=($!)
wait_serving "$DIR/single.log"
S=$(snap "127.0.0.1:$M")
run_loadgen "$P"
figures "127.0.0.1:$M" "$S"
echo "-- 6 events"
run_loadgen "$P" 6
kill -TERM "${PIDS[0]}"; wait "${PIDS[0]}" || true; PIDS=()

echo
cluster() { # $1: groups
  local groups=$1 n
  echo "== 3 nodes, --groups $groups (Raft, a majority fsynced before each reply)$([ "${BENCH_PEER_TLS:-0}" = 1 ] && echo ", peer ports over mutual TLS")"
  declare -A GP MP PP
  local PEERS=""
  for n in 1 2 3; do
    GP[$n]=$(port); MP[$n]=$(port); PP[$n]=$(port)
    if [ "${BENCH_PEER_TLS:-0}" = 1 ]; then
      PEERS+="${PEERS:+,}$n=127.0.0.1:${PP[$n]}"
    else
      PEERS+="${PEERS:+,}$n=127.0.0.1:${GP[$n]}"
    fi
  done
  if [ "${BENCH_PEER_TLS:-0}" = 1 ] && [ ! -f "$DIR/certs/ca.pem" ]; then
    "$BIN" cluster certs --out "$DIR/certs" --node 1=127.0.0.1 --node 2=127.0.0.1 --node 3=127.0.0.1 > /dev/null
  fi
  PIDS=()
  for n in 1 2 3; do
    local PEER_FLAGS=()
    if [ "${BENCH_PEER_TLS:-0}" = 1 ]; then
      PEER_FLAGS=(--peer-listen "127.0.0.1:${PP[$n]}" --peer-ca "$DIR/certs/ca.pem"
        --peer-cert "$DIR/certs/node-$n.pem" --peer-key "$DIR/certs/node-$n.key")
    fi
    "$BIN" serve --node-id "$n" --peers "$PEERS" --listen "127.0.0.1:${GP[$n]}" \
      --metrics-listen "127.0.0.1:${MP[$n]}" --data-dir "$DIR/g$groups-node$n" --groups "$groups" \
      "${PEER_FLAGS[@]}" \
      --cluster-secret-file "$DIR/secret" "${KEYS[@]}" > "$DIR/g$groups-node$n.log" 2>&1 &
    PIDS+=($!)
  done
  for n in 1 2 3; do wait_serving "$DIR/g$groups-node$n.log"; done
  local LEADER=""
  for _ in $(seq 1 100); do
    for n in 1 2 3; do
      [ "$(metric "127.0.0.1:${MP[$n]}" 'boxoffice_raft_leader{group="0"}')" = "1" ] && LEADER=$n
    done
    [ -n "$LEADER" ] && break
    sleep 0.1
  done
  [ -n "$LEADER" ] || { echo "no leader" >&2; exit 1; }
  local FOLLOWER=$(( LEADER % 3 + 1 )) S
  if [ "$groups" = 1 ]; then
    echo "-- to the leader (node $LEADER), one event"
    S=$(snap "127.0.0.1:${MP[$LEADER]}")
    run_loadgen "${GP[$LEADER]}"
    figures "127.0.0.1:${MP[$LEADER]}" "$S"
    echo "-- to a follower (node $FOLLOWER, which forwards to node $LEADER), one event"
    S=$(snap "127.0.0.1:${MP[$LEADER]}")
    run_loadgen "${GP[$FOLLOWER]}"
    figures "127.0.0.1:${MP[$LEADER]}" "$S"
  fi
  echo "-- spread over the nodes' leaders: 6 events, to node 1"
  run_loadgen "${GP[1]}" 6
  for n in 1 2 3; do
    echo "  node $n leads groups: $(curl -s "http://127.0.0.1:${MP[$n]}/metrics" | awk '/^boxoffice_raft_leader\{/ && $2 == 1 { sub(/.*group="/, ""); sub(/".*/, ""); printf "%s ", $0 }')"
  done
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

echo
cluster 1
echo
cluster 3
