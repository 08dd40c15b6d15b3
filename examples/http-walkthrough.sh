#!/usr/bin/env bash
# The README's "Try it" walk-through, as a script that checks each step: a fan joins the line, is
# admitted, holds a seat, pays for it, and the seat map says so; then a second hold is released,
# and a seat already sold is refused with its reason. Needs curl and jq.
#
# Against a server started as the README says:
#   cargo run --release -- serve --http-listen 127.0.0.1:8080 --admin-key adm --client-key cli
#   examples/http-walkthrough.sh
# BOXOFFICE_HTTP, BOXOFFICE_ADMIN_KEY and BOXOFFICE_CLIENT_KEY point it elsewhere. It exits 0
# only if every step answered what the README says; otherwise it names the step and exits 1.
set -euo pipefail

HTTP=${BOXOFFICE_HTTP:-http://127.0.0.1:8080}
ADMIN_KEY=${BOXOFFICE_ADMIN_KEY:-adm}
CLIENT_KEY=${BOXOFFICE_CLIENT_KEY:-cli}

fail() {
    echo "http-walkthrough: FAILED: $*" >&2
    exit 1
}
# Every command of the README's block: on error, say which step broke.
trap 'fail "line $LINENO: $BASH_COMMAND"' ERR

# --- README: try it (begin) ---
H=$HTTP; A="Authorization: Bearer $ADMIN_KEY"; C="Authorization: Bearer $CLIENT_KEY"
J='Content-Type: application/json'
E=show-$(date +%s)   # a new event id each run
# An event of 10 seats in one row (admin key), on sale at once.
curl -sS --fail-with-body -X POST "$H/v1/events" -H "$A" -H "$J" -d '{"eventId":"'$E'",
  "name":"Hot show","sections":[{"sectionId":"orch","name":"Orchestra","priceCents":9000,
  "rows":[{"label":"A","seatCount":10}]}]}' | jq -c '{eventId, state}'
# A fan (ann) joins the waiting room: a queue token and a place in line.
TOKEN=$(curl -sS --fail-with-body "$H/v1/events/$E/queue-token?userId=ann&sessionId=tab-1" \
  -H "$C" | jq -r .token)
# Poll until admitted (about a second): the admission token lets ann hold.
until ADMISSION=$(curl -sS --fail-with-body "$H/v1/queue/$E/status?token=$TOKEN" -H "$C" |
  jq -er 'select(.state == "ADMITTED") | .admissionToken'); do sleep 0.5; done
# Hold seat A:3 (held for the event's hold TTL, 10 minutes), then pay for it.
HOLD=$(curl -sS --fail-with-body -X POST "$H/v1/events/$E/book" -H "$C" -H "$J" \
  -H 'Idempotency-Key: tap-1' -d '{"userId":"ann","token":"'$ADMISSION'","seatId":"orch:A:3"}' |
  jq -r .holdId)
ORDER=$(curl -sS --fail-with-body -X POST "$H/v1/holds/$HOLD/confirm" -H "$C" -H "$J" \
  -H 'Idempotency-Key: pay-1' -d '{"userId":"ann","paymentToken":"tok_visa"}' | jq -r .orderId)
curl -sS --fail-with-body "$H/v1/orders/$ORDER?userId=ann" -H "$C" |
  jq -c '{status, amountCents, seats: [.tickets[].seatId]}'
# Everything ann bought for this show, newest first (pages: ?pageSize= and nextPageToken).
MINE=$(curl -sS --fail-with-body "$H/v1/users/ann/orders?eventId=$E" -H "$C" |
  jq -c '[.orders[].orderId]'); echo "ann's orders: $MINE"
# The seat map: 1 sold, 9 available. It is cacheable: asked again with its ETag, 304.
curl -sS --fail-with-body -D headers.txt "$H/v1/events/$E/seats" -H "$C" |
  jq -c '.sections[] | {sectionId, available, held, sold}'
ETAG=$(grep -i '^etag:' headers.txt | cut -d' ' -f2 | tr -d '\r'); rm headers.txt
NOT_MODIFIED=$(curl -sS -o /dev/null -w '%{http_code}' "$H/v1/events/$E/seats" -H "$C" \
  -H "If-None-Match: $ETAG"); echo "seat map again: $NOT_MODIFIED"
# A second hold (A:4), released: 204, and the seat is free again.
HOLD2=$(curl -sS --fail-with-body -X POST "$H/v1/events/$E/book" -H "$C" -H "$J" \
  -H 'Idempotency-Key: tap-2' -d '{"userId":"ann","token":"'$ADMISSION'","seatId":"orch:A:4"}' |
  jq -r .holdId)
RELEASED=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$H/v1/holds/$HOLD2/release" -H "$C" \
  -H "$J" -d '{"userId":"ann"}'); echo "release: $RELEASED"
# A seat already sold is refused: 409, a problem document whose reason says why.
curl -sS -X POST "$H/v1/events/$E/book" -H "$C" -H "$J" -H 'Idempotency-Key: tap-3' \
  -d '{"userId":"ann","token":"'$ADMISSION'","seatId":"orch:A:3"}' | tee refused.json |
  jq -c '{status, reason}'
# --- README: try it (end) ---

# What the README says each step answers.
trap - ERR
check() {
    local what=$1 got=$2 want=$3
    [ "$got" = "$want" ] || fail "$what: got '$got', want '$want'"
    echo "ok: $what = $want"
}
[ -n "$HOLD" ] && [ "$HOLD" != null ] || fail "the hold has no id"
[ -n "$ORDER" ] && [ "$ORDER" != null ] || fail "the order has no id"
order=$(curl -sS --fail-with-body "$HTTP/v1/orders/$ORDER?userId=ann" -H "$C")
check "order status" "$(jq -r .status <<<"$order")" CONFIRMED
check "order amount" "$(jq -r .amountCents <<<"$order")" 9000
check "order seats" "$(jq -c '[.tickets[].seatId]' <<<"$order")" '["orch:A:3"]'
check "ann's orders" "$MINE" "[\"$ORDER\"]"
check "conditional seat map" "$NOT_MODIFIED" 304
check "release" "$RELEASED" 204
check "released hold" "$(curl -sS --fail-with-body "$HTTP/v1/holds/$HOLD2?userId=ann" -H "$C" |
    jq -r .status)" RELEASED
check "refusal status" "$(jq -r .status refused.json)" 409
check "refusal reason" "$(jq -r .reason refused.json)" SEAT_UNAVAILABLE
rm -f refused.json
map=$(curl -sS --fail-with-body "$HTTP/v1/events/$E/seats" -H "$C")
check "seats sold" "$(jq '[.sections[].sold] | add' <<<"$map")" 1
check "seats available" "$(jq '[.sections[].available] | add' <<<"$map")" 9
echo "http-walkthrough: every step answered as the README says"
