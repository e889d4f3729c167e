#!/usr/bin/env bash
# The whole test suite: installs what the tests need, builds once, runs every
# test (unit, fixture and end-to-end), then stops the test PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-debian.sh --test
# The setup above installed every tool the tests start; a test that finds one
# missing fails rather than skips when CI is set.
export CI="${CI:-true}"

target="${CARGO_TARGET_DIR:-target}"
stop_pg() {
    # The end-to-end tests share one private cluster, reused across runs.
    for d in "$target/debug/e2e-pg" /tmp/flotilla-e2e-pg; do
        if [ -f "$d/pg/postmaster.pid" ]; then
            bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
            if [ "$(id -u)" = 0 ]; then
                runuser -u postgres -- "$bin/pg_ctl" -D "$d/pg" -m fast -w stop >/dev/null 2>&1 || true
            else
                "$bin/pg_ctl" -D "$d/pg" -m fast -w stop >/dev/null 2>&1 || true
            fi
        fi
    done
}
trap stop_pg EXIT

# NVRTC (CUDA 12.6's, from PyPI; no GPU needed) for the test that compiles
# the encoder's GPU kernels with it. Kept in the target directory.
nvrtc_dir="$target/nvrtc-12.6"
if [ ! -e "$nvrtc_dir/libnvrtc.so.12" ]; then
    echo "test: fetching NVRTC 12.6 (nvidia-cuda-nvrtc-cu12 from PyPI) into $nvrtc_dir"
    scripts/wheel-libs.sh 'nvidia-cuda-nvrtc-cu12==12.6.85' "$nvrtc_dir" 'cuda_nvrtc/lib/lib[^/]*'
fi
export LD_LIBRARY_PATH="$(cd "$nvrtc_dir" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FLOTILLA_REQUIRE_NVRTC=1

# oneDNN 3.2 (PyPI's onednn-cpu-gomp: GNU OpenMP, nothing else needed) for
# the tests of the encoder's run-time 3.x path (onednn/tests/v3.rs,
# encoder/tests/onednn3.rs). Only they load it: FLOTILLA_ONEDNN3_TEST names
# it, and they hand it on as FLOTILLA_ONEDNN3; the rest keeps the linked 2.x.
dnnl3_dir="$target/onednn-3"
if [ ! -e "$dnnl3_dir/libdnnl.so.3" ]; then
    echo "test: fetching oneDNN 3.2 (onednn-cpu-gomp from PyPI) into $dnnl3_dir"
    scripts/wheel-libs.sh 'onednn-cpu-gomp==2023.2.0' "$dnnl3_dir" 'lib/libdnnl\.so\.3'
fi
export FLOTILLA_ONEDNN3_TEST="$(cd "$dnnl3_dir" && pwd)/libdnnl.so.3"
export FLOTILLA_REQUIRE_ONEDNN3=1

# Binaries first: the end-to-end tests run them as real processes.
cargo build --workspace --bins --tests
cargo test --workspace --no-fail-fast -- --test-threads "${FLOTILLA_TEST_THREADS:-2}"
