#!/usr/bin/env bash
# Fetch a wheel from PyPI and take shared libraries out of it, by the end of
# their path inside the wheel, into a folder (by their file names):
#
#   scripts/wheel-libs.sh 'nvidia-cuda-nvrtc-cu12==12.6.85' DIR 'cuda_nvrtc/lib/libnvrtc[^/]*'
#
# Each pattern is a Python regular expression that must match the end of a
# member's path; a pattern that matches nothing is an error.
set -euo pipefail
spec="$1" dir="$2"
shift 2
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
python3 -m pip download -q --no-deps -d "$wheels" "$spec"
mkdir -p "$dir"
python3 - "$wheels" "$dir" "$@" <<'PY'
import glob, os, re, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for pattern in sys.argv[3:]:
        found = [n for n in z.namelist() if re.search("(^|/)" + pattern + "$", n)]
        if not found:
            sys.exit(f"{os.path.basename(wheel)}: nothing matches {pattern}")
        for name in found:
            with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as out:
                out.write(z.read(name))
PY
