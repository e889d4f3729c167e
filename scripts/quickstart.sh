#!/usr/bin/env bash
# The README's first command: install what is missing, build, start
# `flotilla up` (private PostgreSQL, server, local agent, local store), run a
# small demo against it, then keep it running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-debian.sh
echo "quickstart: building (release; the first build takes several minutes)"
cargo build --release --bins
bin="${CARGO_TARGET_DIR:-target}/release"
data=./flotilla-data

# As root, `flotilla up` runs PostgreSQL as `postgres` and jobs as
# `flotilla-job`, which must pass through every parent of the data directory;
# flotilla does not open those up. Under a closed one (/root is 0700) the
# data lives in /var/lib/flotilla-quickstart, linked from here so that the
# CLI still finds it.
if [ "$(id -u)" = 0 ] && [ ! -e "$data" ]; then
    closed=
    d=$(pwd -P)
    while :; do
        case $(stat -c %A "$d") in
            ?????????[xt]) ;;
            *) closed=$d ;;
        esac
        [ "$d" = / ] && break
        d=$(dirname "$d")
    done
    if [ -n "$closed" ]; then
        mkdir -p /var/lib/flotilla-quickstart
        ln -s /var/lib/flotilla-quickstart "$data"
        echo "quickstart: $closed is closed to other users; the data lives in /var/lib/flotilla-quickstart (linked from $data)"
    fi
fi

# The server's and agent's logs go to a file, so the demo's output stays readable.
mkdir -p "$data"
log="$data/flotilla-up.log"
"$bin/flotilla" up --data "$data" --listen "${FLOTILLA_LISTEN:-127.0.0.1:8470}" 2>"$log" &
up=$!
echo "quickstart: server and agent logs: $log (tail -f it to watch)"
trap 'kill -TERM $up 2>/dev/null; wait $up' INT TERM

for _ in $(seq 1 120); do
    if [ -f "$data/server.url" ] && curl -fs "$(cat "$data/server.url")/healthz" >/dev/null 2>&1; then
        break
    fi
    kill -0 $up 2>/dev/null || { echo "quickstart: flotilla up exited" >&2; exit 1; }
    sleep 0.5
done

echo
echo "quickstart: demo — two command jobs, one with an output file"
flotilla() { "$bin/flotilla" "$@"; }
flotilla jobs submit --wait -- 'echo "hello from $(hostname), attempt $FLOTILLA_ATTEMPT"'
id=$(flotilla jobs submit --output primes.txt -- 'seq 2 2000 | factor | awk "NF==2{print \$2}" > primes.txt; wc -l < primes.txt')
flotilla jobs wait "$id"
flotilla jobs log "$id"
flotilla jobs show "$id" | grep -E '"(state|key|size|sha256)"'
flotilla agents

echo
echo "quickstart: tile demo — a small random model, synthetic inputs for a 3x2-tile ROI"
demo=$data/demo
mkdir -p "$demo"
"$bin/tessera-encode" synth-ckpt --out "$demo/model.safetensors" --latent-dim 16 --num-layers 1 \
    --nhead 4 --dim-feedforward 64 --seed 1
# Inputs go straight into the local object store under the dataset's prefix:
# demo-inputs/YEAR/TILE/{bands,masks,doys,sar_*}.npy, ~2,500 pixels a tile.
seed=0
for lon in 0.05 0.15 0.25; do
    for lat in 52.05 52.15; do
        seed=$((seed + 1))
        "$bin/tessera-encode" synth-tile --out "$data/store/demo-inputs/2024/grid_${lon}_${lat}" \
            --height 50 --width 50 --s2-frames 24 --s1-asc-frames 12 --s1-desc-frames 12 --seed $seed
    done
done
flotilla datasets add demo --ckpt "$demo/model.safetensors" --inputs demo-inputs >/dev/null
flotilla roi plan --name demo --year 2024 --dataset demo --bbox 0.01,52.01,0.29,52.19
flotilla roi submit --wait --name demo --year 2024 --dataset demo --bbox 0.01,52.01,0.29,52.19 >/dev/null
echo "quickstart: tile embeddings are in $data/store/demo/2024/grid_*/ (grid_X_Y.npy int8 (H,W,128), grid_X_Y_scales.npy f32 (H,W))"
ls "$data/store/demo/2024"
echo "quickstart: load one in numpy: python3 -c \"import numpy; print(numpy.load('$data/store/demo/2024/grid_0.05_52.05/grid_0.05_52.05.npy').shape)\""
echo
echo "quickstart: results are in $data/store (object keys above); the server is at $(cat "$data/server.url")"
echo "quickstart: try \`$bin/flotilla jobs submit --wait -- uname -a\`; Ctrl-C stops everything"
wait $up
