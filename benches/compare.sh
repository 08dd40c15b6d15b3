#!/usr/bin/env bash
# boxoffice against the original design (a booking front on Redis + Lua): the same flash sale
# (100,000 contenders, 10,000 seats, 128 holds in flight over 16 connections by default) played
# against each, one row after the other; see benches/src/compare/mod.rs.
#
#   benches/compare.sh                              # rows a, b, c, d
#   benches/compare.sh --rows a,b,c --json /tmp/compare.json
#
# Needs redis-server for rows (b) and (c): if it is missing and this runs as root with apt-get,
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
    echo "compare.sh: redis-server not found: the Redis rows (b) and (c) will be skipped" >&2
fi

exec cargo run --release -p boxoffice-benches --bin compare -- "$@"
