#!/usr/bin/env bash
# Makes reference answers with opam 2.1.2 (Debian 12's `opam` package) over
# the fixture opam-repository, as ../../../../shared/fixtures/README.md
# describes them: for each TARGET, the three queries opam-repo-ci runs, in a
# fresh OPAMROOT whose switch invariant is ocaml-base-compiler.V.
#
#   revdeps/tests/reference/make.sh V TARGET...
#
# writes ocaml-base-compiler.V/TARGET/{depopts,recursive,with-test-depopts,
# union}.txt and opam-2.1.2-times.txt next to this script. Host variables are
# the host's own: run it on Debian 12 (bookworm main, amd64) after
# `apt-get update`, since opam 2.1 asks apt which depexts it can install.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
fixtures="${FLOTILLA_FIXTURES:-$here/../../../../shared/fixtures}/opam"
[[ $# -ge 2 ]] || { echo "usage: $0 COMPILER_VERSION TARGET..." >&2; exit 2; }
v="$1"; shift
compiler="ocaml-base-compiler.$v"

[[ "$(opam --version)" == 2.1.2 ]] || { echo "needs opam 2.1.2, found $(opam --version)" >&2; exit 1; }
want="arch=x86_64 os=linux os-distribution=debian os-family=debian os-version=12"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo"
tar -xzf "$fixtures/opam-repository-97014be.tar.gz" -C "$work/repo"
export OPAMROOT="$work/root" OPAMYES=1 OPAMCOLOR=never
opam init --bare --no-setup --disable-sandboxing -q default "$work/repo" > "$work/init.log" 2>&1
opam switch create ref --empty -q > "$work/switch.log" 2>&1
# The invariant only names the compiler; nothing is installed.
opam switch set-invariant --switch ref -q "$compiler" > "$work/invariant.log" 2>&1 \
    || opam switch set-invariant --switch ref --force -q "$compiler" >> "$work/invariant.log" 2>&1
got="$(for x in arch os os-distribution os-family os-version; do printf '%s=%s ' "$x" "$(opam var "$x" 2>/dev/null)"; done)"
[[ "${got% }" == "$want" ]] || { echo "host variables are '${got% }', want '$want'" >&2; exit 1; }

for target in "$@"; do
    out="$here/$compiler/$target"
    mkdir -p "$out"
    : > "$out/opam-2.1.2-times.txt"
    for q in "depopts:--depopts" "recursive:--recursive" "with-test-depopts:--with-test --depopts"; do
        name="${q%%:*}"; flags="${q#*:}"
        # shellcheck disable=SC2086 # flags is a word list on purpose
        /usr/bin/time -f "${name//-/} %e s %M KB" -a -o "$out/opam-2.1.2-times.txt" \
            opam list -s --color=never --switch ref --depends-on "$target" \
            --coinstallable-with "$target,$compiler" --all-versions $flags > "$out/$name.txt"
    done
    cat "$out/depopts.txt" "$out/recursive.txt" "$out/with-test-depopts.txt" \
        | grep -vxF "$target" | LC_ALL=C sort -u > "$out/union.txt" || true
    echo "$target on $compiler: $(wc -l < "$out/union.txt") in the union"
done
