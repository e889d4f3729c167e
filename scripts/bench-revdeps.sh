#!/usr/bin/env bash
# Benchmark for issue 4: wall time and peak memory of opam-revdeps' union
# query for coq.9.1.1 and dune.3.20.2 on ocaml-base-compiler.4.14.2, and, in
# the same run, opam 2.1.2 itself on coq.9.1.1 (the three queries
# opam-repo-ci runs). Prints a Markdown table for BENCHMARKS.md.
#
#   scripts/bench-revdeps.sh [--no-opam]
#
# Needs: a release build (`cargo build --release -p opam-revdeps`), GNU time
# (`/usr/bin/time`), and for the opam column Debian's `opam` package
# (`apt-get install opam`, which is 2.1.2 on bookworm).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
fixtures="${FLOTILLA_FIXTURES:-$here/../shared/fixtures}/opam"
target_dir="${CARGO_TARGET_DIR:-$here/target}"
bin="$target_dir/release/opam-revdeps"
run_opam=1
[[ "${1:-}" == "--no-opam" ]] && run_opam=0

[[ -x "$bin" ]] || { echo "no release build at $bin; run: cargo build --release -p opam-revdeps" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "GNU time is missing: apt-get install time" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
repo="$work/opam-repository"
mkdir -p "$repo"
tar -xzf "$fixtures/opam-repository-97014be.tar.gz" -C "$repo"
# The archive may hold one top-level directory; point at the one with packages/.
if [[ ! -d "$repo/packages" ]]; then
    repo="$(dirname "$(find "$repo" -maxdepth 2 -type d -name packages | head -n1)")"
fi

variant=(--compiler ocaml-base-compiler.4.14.2 --arch x86_64 --os linux
    --os-family debian --os-distribution debian --os-version 12 --opam-version 2.1.2)

# time_it LABEL CMD... : runs CMD under GNU time, prints "LABEL wall_s rss_mb", output to $work/LABEL.out
time_it() {
    local label="$1"; shift
    /usr/bin/time -f "%e %M" -o "$work/$label.time" "$@" > "$work/$label.out"
    read -r wall rss_kb < "$work/$label.time"
    echo "$label $wall $((rss_kb / 1024))"
}

echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
echo "| target | tool | wall (s) | peak RSS (MB) | matches fixture |"
echo "|---|---|---|---|---|"
for target in coq.9.1.1 dune.3.20.2; do
    for round in 1 2 3; do
        read -r _ wall rss < <(time_it "ours-$target-$round" "$bin" --repo "$repo" "${variant[@]}" "$target")
        expected="$fixtures/reference/ocaml-base-compiler.4.14.2/$target/union.txt"
        same=no
        cmp -s <(sort "$work/ours-$target-$round.out") <(sort "$expected") && same=yes
        echo "| $target | opam-revdeps (run $round) | $wall | $rss | $same |"
    done
done

if [[ $run_opam == 1 ]]; then
    command -v opam >/dev/null || { echo "opam is not installed (apt-get install opam); rerun with --no-opam" >&2; exit 1; }
    export OPAMROOT="$work/opamroot" OPAMYES=1 OPAMCOLOR=never
    opam init --bare --no-setup --disable-sandboxing -q default "$repo" > "$work/opam-init.log" 2>&1
    opam switch create bench --empty -q > "$work/opam-switch.log" 2>&1
    target=coq.9.1.1
    total=0
    for q in "depopts:--depopts" "recursive:--recursive" "with-test-depopts:--with-test --depopts"; do
        name="${q%%:*}"; flags="${q#*:}"
        # shellcheck disable=SC2086 # flags is a word list on purpose
        read -r _ wall rss < <(time_it "opam-$name" opam list -s --color=never --switch bench \
            --depends-on "$target" --coinstallable-with "$target,ocaml-base-compiler.4.14.2" --all-versions $flags)
        expected="$fixtures/reference/ocaml-base-compiler.4.14.2/$target/$name.txt"
        same=no
        cmp -s <(sort "$work/opam-$name.out") <(sort "$expected") && same=yes
        echo "| $target | opam 2.1.2 --$name | $wall | $rss | $same |"
        total=$(echo "$total + $wall" | bc)
    done
    echo "| $target | opam 2.1.2, three queries | $total | | |"
fi
