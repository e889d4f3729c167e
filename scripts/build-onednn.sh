#!/usr/bin/env bash
# A current oneDNN 3.x for the encoder's run-time 3.x path (`onednn::v3`),
# built here from Debian's source of oneDNN 3.7.2 (trixie's; the binary
# package needs a newer glibc and libstdc++ than bookworm's, and PyPI's
# current `onednn` wheels need Intel's TBB, SVML and SYCL runtimes).
#
#   scripts/build-onednn.sh [DEST]     (default: $CARGO_TARGET_DIR or target, then onednn-3.7)
#
# Only what the encoder calls is built (matmul and reorder, inference, GNU
# OpenMP as the wheels' `onednn-cpu-gomp` 3.2 has, no GPU or graph API), so
# it takes 22-28 minutes, not hours, on two cores. Writes DEST/libdnnl.so.3;
# point FLOTILLA_ONEDNN3 at it. Needs cmake, ninja and g++ (installed from
# apt where missing); `scripts/gpu-check.sh prepare` calls this so that
# the AMX host can time 3.7 beside 3.2.
set -euo pipefail
cd "$(dirname "$0")/.."

version=3.7.2
tarball="onednn_${version}+ds.orig.tar.xz"
sha256=0cc51ca26c1af6a2bb1e71e378e7046f3ceb3e71791ee9d4e246d50f904a6ea6
url="http://deb.debian.org/debian/pool/main/o/onednn/$tarball"
dest="${1:-${CARGO_TARGET_DIR:-target}/onednn-3.7}"

if [ -e "$dest/libdnnl.so.3" ]; then
    echo "build-onednn: $dest/libdnnl.so.3 is there already"
    exit 0
fi
# Missing tools come from apt, as scripts/setup-debian.sh installs its own
# (a device session's `prepare` should not stop for them).
missing=()
for tool in cmake:cmake ninja:ninja-build g++:g++ curl:curl xz:xz-utils; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    # -n: a sudo that would ask for a password fails here (and says so
    # below) instead of waiting on a prompt nobody sees.
    [ "$(id -u)" = 0 ] || sudo="sudo -n"
    echo "build-onednn: installing ${missing[*]}"
    { $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } || {
        echo "build-onednn: could not install ${missing[*]}; apt-get install them, or prepare with GPU_CHECK_ONEDNN37=0" >&2
        exit 1
    }
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build-onednn: fetching $url"
curl -fsS --retry 3 -o "$work/$tarball" "$url"
echo "$sha256  $work/$tarball" | sha256sum -c --quiet - || {
    echo "build-onednn: $tarball does not match its sha256 (Debian's trixie Sources list)" >&2
    exit 1
}
tar -xf "$work/$tarball" -C "$work"
src="$work/oneDNN-$version"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDNNL_CPU_RUNTIME=OMP -DDNNL_GPU_RUNTIME=NONE -DONEDNN_BUILD_GRAPH=OFF \
    -DDNNL_BUILD_EXAMPLES=OFF -DDNNL_BUILD_TESTS=OFF -DDNNL_ENABLE_WORKLOAD=INFERENCE \
    '-DDNNL_ENABLE_PRIMITIVE=MATMUL;REORDER' >"$work/cmake.log" 2>&1 || {
    tail -20 "$work/cmake.log" >&2
    exit 1
}
echo "build-onednn: compiling (22-28 minutes on two cores)"
ninja -C "$work/build" dnnl >"$work/ninja.log" || {
    tail -30 "$work/ninja.log" >&2
    exit 1
}
mkdir -p "$dest"
cp -L "$work/build/src/libdnnl.so.3" "$dest/libdnnl.so.3"
strip --strip-unneeded "$dest/libdnnl.so.3"
echo "build-onednn: wrote $dest/libdnnl.so.3 (oneDNN $version)"
