#!/usr/bin/env bash
# Installs what flotilla needs on Debian/Ubuntu, skipping what is present:
# PostgreSQL (the embedded default runs the system's initdb/pg_ctl), oneDNN
# (the encoder's fast CPU path), a C toolchain. With --test, also what the
# test suite starts or reads with: an S3-compatible server (moto), numpy and
# an OpenAPI fuzzer (schemathesis), from PyPI; sshd and ssh (pipeline steps
# on ssh hosts), poppler-utils and tesseract (the pipeline tests' PDF pages
# and OCR), prometheus (its server and promtool, which the metrics tests
# start), chromium and chromium-driver (the browser tests drive it
# headless), nftables (the chaos test cuts an agent off with nft), from apt.
set -euo pipefail

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
    sudo="sudo"
fi

pkgs=(postgresql libdnnl-dev build-essential pkg-config git ca-certificates curl python3 python3-pip)
if [ "$want_test" = 1 ]; then
    pkgs+=(openssh-server openssh-client poppler-utils tesseract-ocr tesseract-ocr-eng prometheus chromium chromium-driver nftables)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's postgresql package starts a system cluster; flotilla does not use
# it (it makes a private one), so it is left as the package set it up.

if ! command -v cargo >/dev/null; then
    echo "setup: no Rust toolchain found; install one from your distribution or rustup" >&2
    exit 1
fi

if [ "$want_test" = 1 ] && ! python3 -c 'import moto.server' 2>/dev/null; then
    echo "setup: installing moto[server] (an S3-compatible server for the tests)"
    python3 -m pip install -q 'moto[server]>=5,<6' 2>/dev/null \
        || python3 -m pip install -q --break-system-packages 'moto[server]>=5,<6'
fi
if [ "$want_test" = 1 ] && ! command -v schemathesis >/dev/null 2>&1; then
    echo "setup: installing schemathesis (the OpenAPI fuzzer of tests/tests/e2e/openapi.rs)"
    python3 -m pip install -q 'schemathesis>=4.32,<5' 2>/dev/null \
        || python3 -m pip install -q --break-system-packages 'schemathesis>=4.32,<5'
fi
if [ "$want_test" = 1 ] && ! python3 -c 'import numpy' 2>/dev/null; then
    echo "setup: installing numpy (the tests load tile outputs with it)"
    python3 -m pip install -q numpy 2>/dev/null \
        || python3 -m pip install -q --break-system-packages numpy
fi
