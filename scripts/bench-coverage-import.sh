#!/usr/bin/env bash
# Coverage import (review M8): for each flotilla binary given, the wall time
# of `POST /api/v1/coverage/import` of a 2,000,000-row manifest (8 years of
# 250,000 random tiles, 5 % absent, written by pyarrow with snappy as
# geotessera's is) and of a 2.8 KB manifest whose first page declares 2 GiB,
# each through `flotilla up --agents 0`, with the server process's peak
# resident memory (VmHWM) before and after. Binaries alternate, `ROUNDS`
# (2) times.
#
#   scripts/bench-coverage-import.sh BIN [BIN…]
#
# Needs python3 with numpy and pyarrow (`pip install numpy pyarrow`) and curl.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN…]" >&2; exit 2; }
rounds="${ROUNDS:-2}"
work="$(mktemp -d /tmp/flotilla-cov-bench-XXXX)"
# `flotilla up` as root runs jobs as another user, who must pass through.
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT

python3 - "$work" <<'PY'
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
work = sys.argv[1]
rng = np.random.default_rng(1)
cells = rng.choice(3600 * 1800, size=250_000, replace=False)
ix, iy = cells % 3600 - 1800, cells // 3600 - 900
years = np.repeat(np.arange(2017, 2025, dtype=np.int64), len(cells))
grid = rng.integers(1, 10**9, size=len(years))
grid[rng.random(len(years)) < 0.05] = 0
pq.write_table(pa.table({
    "year": years, "lon": np.tile((ix + 0.5) / 10, 8), "lat": np.tile((iy + 0.5) / 10, 8),
    "grid_size": grid, "scales_size": rng.integers(1, 10**7, size=len(years))}),
    f"{work}/manifest-2m.parquet")
# The hostile one: 1,000 rows, one snappy data page a column; the first
# page's header says 2 GiB - 1 uncompressed. The size's varint grows by k
# bytes, so the page's data gives up its last k (the compressed size says
# so) and every offset after it holds (as tests/tests/e2e/tiles_e2e.rs).
n = 1000
pq.write_table(pa.table({
    "year": np.full(n, 2024, dtype=np.int32), "lon": 10.05 + (np.arange(n) % 10) / 10,
    "lat": np.full(n, 10.05), "grid_size": np.full(n, 1000, dtype=np.int64),
    "scales_size": np.full(n, 10, dtype=np.int64)}), f"{work}/plain.parquet",
    compression="snappy", use_dictionary=False, write_statistics=False,
    data_page_version="1.0", write_page_index=False)
buf = open(f"{work}/plain.parquet", "rb").read()
col = pq.ParquetFile(f"{work}/plain.parquet").metadata.row_group(0).column(0)
assert col.data_page_offset == 4 and buf[4:7] == b"\x15\x00\x15"
end = 4 + col.total_compressed_size
def varint(i):
    v = k = 0
    while True:
        v |= (buf[i + k] & 0x7F) << (7 * k)
        k += 1
        if buf[i + k - 1] & 0x80 == 0:
            return v, k
def enc(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    return bytes(out + bytes([v]))
_, ul = varint(7)
c, cl = varint(8 + ul)
huge = enc((2**31 - 1) << 1)
grown = len(huge) - ul
cnew = enc(((c >> 1) - grown) << 1)
assert len(cnew) == cl
open(f"{work}/hostile.parquet", "wb").write(
    buf[:7] + huge + b"\x15" + cnew + buf[8 + ul + cl:end - grown] + buf[end:])
PY

one() {
    local bin=$1 manifest=$2 d up url token hwm0 hwm t0 t1 answer
    d="$(mktemp -d "$work/up-XXXX")"
    chmod 755 "$d"
    (cd "$d" && exec "$bin" up --data "$d/data" --listen 127.0.0.1:0 --agents 0 >"$d/up.log" 2>&1) &
    up=$!
    for _ in $(seq 480); do [ -s "$d/data/server.url" ] && break; sleep 0.5; done
    url="$(cat "$d/data/server.url")"
    token="$(cat "$d/data/admin.token")"
    curl -sf -H "Authorization: Bearer $token" -H 'content-type: application/json' \
        -d '{"name":"m","fetch_command":"true"}' "$url/api/v1/datasets" >/dev/null
    hwm0=$(awk '/VmHWM/ {print $2}' "/proc/$up/status")
    t0=$(date +%s%N)
    answer=$(curl -s -w ' HTTP %{http_code}' -H "Authorization: Bearer $token" \
        --data-binary @"$manifest" "$url/api/v1/coverage/import?dataset=m")
    t1=$(date +%s%N)
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$up/status")
    echo "| $(basename "$bin") | $(basename "$manifest") | $(( (t1 - t0) / 1000000 )) ms |" \
        "$((hwm0 / 1024)) -> $((hwm / 1024)) MiB | ${answer:0:160} |"
    kill "$up"
    wait "$up" 2>/dev/null || true
}

echo "| binary | manifest | import | server peak RSS | answer |"
echo "|---|---|---|---|---|"
for _ in $(seq "$rounds"); do
    for bin in "$@"; do
        one "$(realpath "$bin")" "$work/manifest-2m.parquet"
        one "$(realpath "$bin")" "$work/hostile.parquet"
    done
done
