#!/usr/bin/env python3
"""Fidelity of an encode of the fixtures against upstream's f32 (issue 16's rule for bf16).

    fidelity.py FIXTURES LABEL PREFIX [--rule 0.9999]

For each case (small, long) of FIXTURES, PREFIX-CASE/tile.npy is the int8
encode (`tessera-encode --int8`) and PREFIX-CASE-f/tile.npy the f32 one of
the same run settings. Prints the worst pixel's cosine against upstream's
f32, the largest error, and the int8 codes' agreement (equal, within one,
largest difference); with --rule, exits 1 when a worst cosine is below it.
"""
import argparse
import sys

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("fixtures")
    p.add_argument("label")
    p.add_argument("prefix")
    p.add_argument("--rule", type=float)
    a = p.parse_args()
    bad = False
    for case in ("small", "long"):
        want = np.load(f"{a.fixtures}/{case}/expected/emb_f32.npy").astype(np.float64)
        codes_want = np.load(f"{a.fixtures}/{case}/expected/tile.npy").astype(np.int32)
        k = ~np.load(f"{a.fixtures}/{case}/expected/nodata.npy").reshape(want.shape[:-1])
        got = np.load(f"{a.prefix}-{case}-f/tile.npy").astype(np.float64)
        codes = np.load(f"{a.prefix}-{case}/tile.npy").astype(np.int32)
        cos = (got[k] * want[k]).sum(-1) / np.linalg.norm(got[k], axis=-1) / np.linalg.norm(want[k], axis=-1)
        d = np.abs(codes[k] - codes_want[k])
        ok = a.rule is None or cos.min() >= a.rule
        bad |= not ok
        verdict = "" if a.rule is None else (" -> OK" if ok else f" -> FAILS the rule (>= {a.rule})")
        print(f"{case} {a.label}: worst cosine {cos.min():.7f}, max abs error {np.abs(got[k] - want[k]).max():.2e}, "
              f"int8 codes equal {100 * (d == 0).mean():.1f} %, within one {100 * (d <= 1).mean():.1f} %, "
              f"largest difference {d.max()}{verdict}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
