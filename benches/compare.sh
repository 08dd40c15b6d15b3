#!/usr/bin/env bash
# boxoffice against the original design (a booking front on Redis + Lua): two workloads, each
# reported on its own (the flash sale: 100,000 contenders for 10,000 places; success-heavy:
# 100,000 contenders for 100,000 places), 128 holds in flight over 16 connections, an
# idempotency key per attempt on both sides, played against each row one after the other; see
# benches/src/compare/mod.rs for what each row does and does not do.
#
#   benches/compare.sh                              # rows a to e, both workloads
#   benches/compare.sh --rows a,c,d --workloads success --json /tmp/compare.json
#   benches/compare.sh --no-keys                    # no idempotency keys anywhere
#
# Needs redis-server for rows (b), (c) and (e): if it is missing and this runs as root with apt-get,
# it is installed (Debian's redis-server; its package also starts a system service on port
# 6379, which the comparison does not use: it starts its own on a free port). If it is still
# missing, those rows are skipped and say so. Every argument goes to the binary (--help).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "compare.sh: redis-server not found: installing it with apt-get" >&2
        apt-get update || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server \
            || echo "compare.sh: apt-get could not install redis-server" >&2
    fi
fi
if ! command -v redis-server >/dev/null 2>&1; then
    echo "compare.sh: redis-server not found: the Redis rows (b), (c) and (e) will be skipped" >&2
fi

exec cargo run --release -p boxoffice-benches --bin compare -- "$@"
