#!/usr/bin/env bash
# The README's local cluster, checked: three `serve` nodes with HTTP ports, a hold made through a
# follower, `kill -9` of the leader, and the hold read back through a node still alive. Needs
# curl and jq. Exits 0 only if the hold survives as it was acknowledged.
#   cargo build --release && examples/cluster.sh          # target/release/boxoffice
#   BOXOFFICE_BIN=path/to/boxoffice examples/cluster.sh
# Ports 50061-50063 (gRPC), 50071-50073 (the peer ports: Raft and forwarded calls, mutual TLS
# under the cluster's CA made by `boxoffice cluster certs`), 9461-9463 (metrics) and 8081-8083
# (HTTP) on 127.0.0.1, as in the README; BOXOFFICE_PORT_BASE=N moves them to N+1..N+3,
# N+301..N+303, N+101..N+103 and N+201..N+203.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${BOXOFFICE_BIN:-target/release/boxoffice}")
[ -x "$bin" ] || { echo "examples/cluster.sh: no binary at $bin (cargo build --release)" >&2; exit 2; }
work=$(mktemp -d)
pids=()
cleanup() {
    # In braces with stderr closed: bash's own "Killed" notices of the nodes go too.
    {
        for p in "${pids[@]}"; do kill -9 "$p" || true; done
        wait || true
    } 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "examples/cluster.sh: FAILED: $*" >&2
    for n in 1 2 3; do echo "--- node $n's log:" >&2; tail -20 "$work/node$n.log" >&2 || true; done
    exit 1
}

base=${BOXOFFICE_PORT_BASE:-}
grpc() { if [ -n "$base" ]; then echo $((base + $1)); else echo "5006$1"; fi; }
metrics() { if [ -n "$base" ]; then echo $((base + 100 + $1)); else echo "946$1"; fi; }
http() { if [ -n "$base" ]; then echo $((base + 200 + $1)); else echo "808$1"; fi; }
peer() { if [ -n "$base" ]; then echo $((base + 300 + $1)); else echo "5007$1"; fi; }
peers="1=127.0.0.1:$(peer 1),2=127.0.0.1:$(peer 2),3=127.0.0.1:$(peer 3)"
echo "a-long-random-cluster-secret" >"$work/cluster-secret"
"$bin" cluster certs --out "$work/certs" --node 1=127.0.0.1 --node 2=127.0.0.1 --node 3=127.0.0.1 >/dev/null
declare -A pid_of
for n in 1 2 3; do
    "$bin" serve --node-id "$n" --peers "$peers" \
        --listen "127.0.0.1:$(grpc "$n")" --metrics-listen "127.0.0.1:$(metrics "$n")" \
        --http-listen "127.0.0.1:$(http "$n")" --data-dir "$work/node$n" \
        --peer-listen "127.0.0.1:$(peer "$n")" --peer-ca "$work/certs/ca.pem" \
        --peer-cert "$work/certs/node-$n.pem" --peer-key "$work/certs/node-$n.key" \
        --cluster-secret-file "$work/cluster-secret" \
        --admin-key adm --client-key cli --token-secret tok >"$work/node$n.log" 2>&1 &
    pids+=($!)
    pid_of[$n]=$!
done

# The node whose metrics say it leads group 0 (empty while there is none).
leader() {
    for n in "$@"; do
        if curl -sf "127.0.0.1:$(metrics "$n")/metrics" | grep -q '^boxoffice_raft_leader{group="0"} 1'; then
            echo "$n"
            return
        fi
    done
}
wait_leader() {
    for _ in $(seq 1 300); do
        l=$(leader "$@")
        [ -n "$l" ] && { echo "$l"; return; }
        sleep 0.2
    done
}
first=$(wait_leader 1 2 3)
[ -n "$first" ] || fail "no leader within a minute"
follower=$(( first % 3 + 1 ))
echo "node $first leads; the hold goes through node $follower, a follower"

C='Authorization: Bearer cli'; A='Authorization: Bearer adm'; J='Content-Type: application/json'
H="http://127.0.0.1:$(http "$follower")"
E=cluster-$(date +%s)
# Calls through a follower are forwarded; retried while the cluster settles (a new leader's
# engine may still be opening: 503 NOT_READY).
call() {
    local out code
    for _ in $(seq 1 150); do
        out=$(curl -sS -w '\n%{http_code}' "$@" 2>&1) || true
        code=${out##*$'\n'}
        out=${out%$'\n'*}
        case $code in
        2??) echo "$out"; return ;;
        000 | 502 | 503 | 504) sleep 0.2 ;;   # not reachable, or no leader yet: retry
        *) fail "curl $*: $code $out" ;;
        esac
    done
    fail "curl $*: still $code after 30 s: $out"
}
call -X POST "$H/v1/events" -H "$A" -H "$J" -d '{"eventId":"'$E'","name":"Cluster show",
  "sections":[{"sectionId":"floor","name":"Floor","priceCents":5000,"capacity":100}]}' >/dev/null
TOKEN=$(call "$H/v1/events/$E/queue-token?userId=bo&sessionId=s1" -H "$C" | jq -r .token)
for _ in $(seq 1 100); do
    ADMISSION=$(call "$H/v1/queue/$E/status?token=$TOKEN" -H "$C" |
        jq -r 'select(.state == "ADMITTED") | .admissionToken')
    [ -n "$ADMISSION" ] && break
    sleep 0.2
done
[ -n "$ADMISSION" ] || fail "not admitted"
held=$(call -X POST "$H/v1/events/$E/book" -H "$C" -H "$J" -H 'Idempotency-Key: cl-1' \
    -d '{"userId":"bo","token":"'$ADMISSION'","sectionId":"floor","quantity":2}')
HOLD=$(jq -r .holdId <<<"$held")
[ "$(jq -r .status <<<"$held")" = HELD ] || fail "the hold was not made: $held"
echo "held $HOLD through node $follower"

{ kill -9 "${pid_of[$first]}" && wait "${pid_of[$first]}"; } 2>/dev/null || true
echo "killed node $first (kill -9), the leader"
alive=()
for n in 1 2 3; do [ "$n" != "$first" ] && alive+=("$n"); done
next=$(wait_leader "${alive[@]}")
[ -n "$next" ] || fail "no new leader within a minute of the kill"
echo "node $next leads now"
reader=${alive[0]}
[ "$reader" = "$next" ] && reader=${alive[1]}
back=$(call "http://127.0.0.1:$(http "$reader")/v1/holds/$HOLD?userId=bo" -H "$C")
[ "$(jq -r .holdId <<<"$back")" = "$HOLD" ] || fail "another hold read back: $back"
[ "$(jq -r .status <<<"$back")" = HELD ] || fail "the hold is not HELD after the kill: $back"
[ "$(jq -r .quantity <<<"$back")" = 2 ] || fail "the hold lost places: $back"
echo "read back through node $reader after the kill: $HOLD, HELD, 2 places"
echo "examples/cluster.sh: the acknowledged hold survived the leader's kill -9"
