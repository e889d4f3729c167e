#!/usr/bin/env bash
# The whole test suite: installs what the tests need, builds once, runs every
# test (unit, fixture and end-to-end), then stops the test PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-debian.sh --test

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

# Binaries first: the end-to-end tests run them as real processes.
cargo build --workspace --bins --tests
cargo test --workspace --no-fail-fast -- --test-threads "${FLOTILLA_TEST_THREADS:-2}"
