#!/usr/bin/env bash
# The long chaos run: the end-to-end test tests/tests/chaos (three server
# replicas, four agents, a private PostgreSQL; servers and agents SIGKILLed
# and restarted, PostgreSQL restarted, an agent partitioned past its lease)
# for FLOTILLA_CHAOS_SECS seconds, 900 (15 minutes) unless set, then the
# invariants and the summary. Needs root (`ip netns`, `nft`).
#   scripts/chaos.sh            # 15 minutes
#   FLOTILLA_CHAOS_SECS=3600 scripts/chaos.sh
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "chaos: run as root (network namespaces and nft)" >&2; exit 1; }
command -v nft >/dev/null || { echo "chaos: nft is missing (scripts/setup-debian.sh --test installs nftables)" >&2; exit 1; }
export FLOTILLA_CHAOS_SECS="${FLOTILLA_CHAOS_SECS:-900}"
if [ "$FLOTILLA_CHAOS_SECS" -lt 600 ]; then
    echo "chaos: note: FLOTILLA_CHAOS_SECS=$FLOTILLA_CHAOS_SECS; the long form is 600 or more" >&2
fi
cargo build --bins
log="${CHAOS_LOG:-target/chaos-$(date -u +%Y%m%dT%H%M%SZ).log}"
echo "chaos: $FLOTILLA_CHAOS_SECS s of faults; full log in $log"
set +e
cargo test -p flotilla-e2e --test chaos -- --nocapture 2>&1 | tee "$log" | grep --line-buffered -E '^chaos|test result|panicked'
status=${PIPESTATUS[0]}
set -e
# The summary, as the test printed it.
sed -n '/==== chaos summary ====/,/==== end of summary ====/p' "$log"
exit "$status"
