#!/usr/bin/env bash
# The README's first command: install what is missing, build, start
# `flotilla up` (private PostgreSQL, server, local agent, local store), run a
# small demo against it, then keep it running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-debian.sh
echo "quickstart: building (release; the first build takes several minutes)"
cargo build --release --bins
bin=target/release
data=./flotilla-data

"$bin/flotilla" up --data "$data" --listen "${FLOTILLA_LISTEN:-127.0.0.1:8470}" &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up' INT TERM

for _ in $(seq 1 120); do
    if [ -f "$data/server.url" ] && curl -fs "$(cat "$data/server.url")/healthz" >/dev/null 2>&1; then
        break
    fi
    kill -0 $up 2>/dev/null || { echo "quickstart: flotilla up exited" >&2; exit 1; }
    sleep 0.5
done

echo
echo "quickstart: demo — three command jobs, one with an output file"
flotilla() { "$bin/flotilla" "$@"; }
flotilla jobs submit --wait -- 'echo "hello from $(hostname), attempt $FLOTILLA_ATTEMPT"'
id=$(flotilla jobs submit --output primes.txt -- 'seq 2 2000 | factor | awk "NF==2{print \$2}" > primes.txt; wc -l < primes.txt')
flotilla jobs wait "$id"
flotilla jobs log "$id"
flotilla jobs show "$id" | grep -E '"(state|key|size|sha256)"'
flotilla agents
echo
echo "quickstart: results are in $data/store (object keys above); the server is at $(cat "$data/server.url")"
echo "quickstart: try \`$bin/flotilla jobs submit --wait -- uname -a\`; Ctrl-C stops everything"
wait $up
