#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU but no Rust
# toolchain (such as a borrowed CUDA 13 box). Two halves:
#
#   scripts/gpu-check.sh prepare   # here: build, strip and collect into .gpucheck/
#   scripts/gpu-check.sh run       # there, from the repository root, with .gpucheck/ copied along
#
# `prepare` builds `tessera-encode` and the encoder's fixture-test binary
# with only the `cuda` feature (no oneDNN: nothing to install there), and
# copies the encoder fixtures (the test binary finds them at the path it
# was built with, which `run` recreates). `run` prints what the backend
# sees, runs the fixture tests (the CUDA backend included wherever a GPU
# answers), then times the Large model and sweeps the chunk size. It ends
# well inside 10 minutes; its log is also written to $OUT/gpu-check.log
# when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpucheck

case "${1:-}" in
prepare)
    target="${CARGO_TARGET_DIR:-target}"
    cargo build --release -p tessera-encoder --no-default-features --features cuda
    test_bin=$(cargo test -p tessera-encoder --no-default-features --features cuda \
        --test fixtures --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "fixtures":
        print(m["executable"])' | tail -n 1)
    chmod -R u+w "$dest" 2>/dev/null || true
    rm -rf "$dest"
    mkdir -p "$dest"
    cp "$target/release/tessera-encode" "$dest/"
    cp "$test_bin" "$dest/fixtures-test"
    strip "$dest/tessera-encode" "$dest/fixtures-test"
    cp -r ../shared/fixtures/encoder "$dest/fixtures-encoder"
    chmod -R u+w "$dest"
    # Where the test binary looks for ../../shared/fixtures/encoder.
    manifest=$(cd encoder && pwd)
    echo "$manifest" >"$dest/manifest-dir"
    du -sh "$dest"
    echo "carry $dest, then run: scripts/gpu-check.sh run"
    ;;
run)
    log="${OUT:-/tmp}/gpu-check.log"
    exec > >(tee "$log") 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    # cudarc asks for libcublas.so / libnvrtc.so (or .so.12); a CUDA 13
    # install names them .so.13: link them under the plain names.
    links=$(mktemp -d)
    for lib in libcublas libcublasLt libnvrtc libnvrtc-builtins; do
        found=$( (ldconfig -p 2>/dev/null | awk -v l="$lib.so." '$1 ~ "^"l {print $NF}';
            find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib \
                "$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || echo /nonexistent)" \
                -name "$lib.so.*" 2>/dev/null) | sort -V | tail -n 1 || true)
        if [ -n "$found" ]; then
            ln -sf "$found" "$links/$lib.so"
            echo "$lib.so -> $found"
        else
            echo "$lib: not found"
        fi
    done
    export LD_LIBRARY_PATH="$links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    manifest=$(cat "$dest/manifest-dir")
    # Recreate the fixtures where the test binary looks, unless they are
    # there already (as on the machine that built it).
    if [ ! -d "$manifest/../../shared/fixtures/encoder" ]; then
        mkdir -p "$manifest" "$manifest/../../shared/fixtures"
        cp -r "$dest/fixtures-encoder" "$manifest/../../shared/fixtures/encoder"
    fi

    "$dest/tessera-encode" backends
    echo "== fixture tests (every usable backend, CUDA included if listed above)"
    "$dest/fixtures-test" --test-threads 1 --nocapture 2>&1 | grep -Ev '^\s*$' || true
    echo "== Large model, 64 + 64 observations, CUDA against the CPU"
    timeout 240 "$dest/tessera-encode" bench --backends cuda,cpu --pixels 2048 --threads 16 \
        --batch-pixels 1024 || echo "bench failed or timed out"
    echo "== the same with TF32 tensor cores (profile dtype tf32)"
    timeout 90 "$dest/tessera-encode" bench --backends cuda --pixels 8192 --threads 1 \
        --batch-pixels 1024 --dtype tf32 || echo "tf32 bench failed or timed out"
    echo "== tune: chunk sweep, best written to ${OUT:-/tmp}/tessera-profiles.toml"
    timeout 200 "$dest/tessera-encode" tune --backend cuda \
        --profile "${OUT:-/tmp}/tessera-profiles.toml" || echo "tune failed or timed out"
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
