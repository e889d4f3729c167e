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
    # Put back the default-feature build the CUDA-only one replaced.
    cargo build --release -p tessera-encoder
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
    # cudarc asks for libcublas.so / libnvrtc.so (or .so.12). Pick the
    # newest of each that the driver serves (toolkit or pip wheels), link
    # it under the plain name, and put its folder on the path too (for
    # libcublasLt and libnvrtc-builtins, which are loaded by their
    # versioned names).
    links=$(mktemp -d)
    picked=$(python3 - <<'PY'
import glob, os, re, subprocess
try:
    out = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
    driver = int(re.search(r"CUDA Version: (\d+)", out).group(1))
except Exception:
    driver = 99
dirs = set(glob.glob("/usr/local/cuda*/lib64") + glob.glob("/usr/local/cuda*/targets/*/lib"))
try:
    import nvidia
    for p in nvidia.__path__:
        dirs |= set(glob.glob(os.path.join(p, "*", "lib")))
except Exception:
    pass
best = {}
for d in dirs:
    for lib in ("libcublas", "libnvrtc"):
        for f in glob.glob(os.path.join(d, lib + ".so.*")):
            m = re.fullmatch(re.escape(lib) + r"\.so\.(\d+)", os.path.basename(f))
            if m and int(m.group(1)) <= driver and (lib not in best or int(m.group(1)) > best[lib][0]):
                best[lib] = (int(m.group(1)), os.path.realpath(f))
for lib, (_, f) in sorted(best.items()):
    print(lib, f)
PY
)
    libpath="$links"
    while read -r lib file; do
        [ -n "$lib" ] || continue
        ln -sf "$file" "$links/$lib.so"
        libpath="$libpath:$(dirname "$file")"
        echo "$lib.so -> $file"
    done <<<"$picked"
    export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    manifest=$(cat "$dest/manifest-dir")
    # Recreate the fixtures where the test binary looks, unless they are
    # there already (as on the machine that built it).
    if [ ! -d "$manifest/../../shared/fixtures/encoder" ]; then
        mkdir -p "$manifest" "$manifest/../../shared/fixtures"
        cp -r "$dest/fixtures-encoder" "$manifest/../../shared/fixtures/encoder"
    fi

    failed=0
    "$dest/tessera-encode" backends
    echo "== fixture tests (every usable backend, CUDA included if listed above)"
    "$dest/fixtures-test" --test-threads 1 --nocapture || failed=1
    echo "== Large model, large chunk: CUDA against the CPU on one synthetic tile"
    work=$(mktemp -d)
    "$dest/tessera-encode" synth-ckpt --out "$work/large.safetensors"
    "$dest/tessera-encode" synth-tile --out "$work/tile" --height 48 --width 48
    for b in cpu cuda; do
        "$dest/tessera-encode" --backend "$b" --batch-pixels 2304 --ckpt "$work/large.safetensors" \
            --tile "$work/tile" --out-dir "$work/$b" || failed=1
    done
    python3 - "$work" <<'PY' || failed=1
import sys, numpy as np
w = sys.argv[1]
a, b = np.load(f"{w}/cpu/tile.npy"), np.load(f"{w}/cuda/tile.npy")
ok = ~np.isnan(a).any(-1)
cos = (a[ok] * b[ok]).sum(-1) / np.linalg.norm(a[ok], axis=-1) / np.linalg.norm(b[ok], axis=-1)
err = np.abs(a[ok] - b[ok]).max()
print(f"cuda vs cpu, Large model, {ok.sum()} pixels: worst cosine {cos.min():.9f}, max abs error {err:.2e}")
sys.exit(0 if cos.min() >= 0.99999 and err <= 1e-4 else 1)
PY
    echo "== Large model, 64 + 64 observations, CUDA against the CPU"
    timeout 240 "$dest/tessera-encode" bench --backends cuda,cpu --pixels 2048 --threads 16 \
        --batch-pixels 1024 || echo "bench failed or timed out"
    echo "== the same with TF32 tensor cores (profile dtype tf32)"
    timeout 90 "$dest/tessera-encode" bench --backends cuda --pixels 8192 --threads 1 \
        --batch-pixels 1024 --dtype tf32 || echo "tf32 bench failed or timed out"
    echo "== the same with bf16 tensor cores (profile dtype bf16: GEMM inputs rounded to bf16, f32 accumulation)"
    timeout 90 "$dest/tessera-encode" bench --backends cuda --pixels 8192 --threads 1 \
        --batch-pixels 1024 --dtype bf16 || echo "bf16 bench failed or timed out"
    echo "== tune: chunk sweep, best written to ${OUT:-/tmp}/tessera-profiles.toml"
    timeout 200 "$dest/tessera-encode" tune --backend cuda \
        --profile "${OUT:-/tmp}/tessera-profiles.toml" || echo "tune failed or timed out"
    if [ "$failed" != 0 ]; then
        echo "gpu-check: FAILED (see above)"
        exit 1
    fi
    echo "gpu-check: all checks passed"
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
