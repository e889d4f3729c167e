#!/usr/bin/env bash
# Where an onednn encode's worker threads spend their time: inside oneDNN
# (its JIT kernels and libdnnl) or in our code between the matmuls
# (LayerNorm, softmax, conversions, pooling, f32 attention). Samples the
# worker threads (named onednn-*) with `perf record` and prints, per run,
# the wall time and the two sums in ms of thread time.
#
#   scripts/onednn-own-time.sh [BIN...]
#
# Each BIN (default target/release/tessera-encode) encodes the same
# synthetic Large tile (8 x 16 px, 64 + 32 + 32 frames, random weights)
# REPS times (default 3), alternating between the binaries so a change in
# the machine's load hits each alike. DTYPE (default bf16), THREADS
# (default 2) and EXTRA_ENV (words like FLOTILLA_ONEDNN_F32_ATTENTION=1,
# applied to every run) can be set. Needs perf (linux-perf).
set -euo pipefail
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/tessera-encode)
dtype="${DTYPE:-bf16}" threads="${THREADS:-2}" reps="${REPS:-3}"
command -v perf >/dev/null || { echo "perf not found: apt-get install linux-perf" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${bins[0]}" synth-ckpt --out "$work/large.safetensors" --seed 1 >/dev/null 2>&1
"${bins[0]}" synth-tile --out "$work/tile" --height 8 --width 16 --s2-frames 64 \
    --s1-asc-frames 32 --s1-desc-frames 32 --clear 1.0 --seed 3 >/dev/null 2>&1
for _ in $(seq "$reps"); do
    for bin in "${bins[@]}"; do
        rm -rf "$work/out"
        # shellcheck disable=SC2086 # EXTRA_ENV is words
        wall=$(env ${EXTRA_ENV:-} perf record -q -F 2000 -o "$work/perf.data" "$bin" \
            --ckpt "$work/large.safetensors" --tile "$work/tile" --out-dir "$work/out" \
            --backend onednn --threads "$threads" --dtype "$dtype" 2>&1 |
            sed -n 's/.*px in \([0-9.]*\) s.*/\1/p')
        # At 2,000 samples a second each sample is 0.5 ms of a thread.
        perf report -i "$work/perf.data" -n --no-children --sort comm,dso 2>/dev/null | grep -v '^#' |
            awk -v bin="$bin" -v wall="$wall" 'NF >= 4 && $3 ~ /^onednn-/ {
                if ($4 ~ /JIT|libdnnl/) d += $2; else o += $2 }
                END { printf "%s: wall %s s, in oneDNN %.0f ms, ours %.0f ms\n", bin, wall, d / 2, o / 2 }'
    done
done
