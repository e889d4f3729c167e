#!/usr/bin/env python3
"""PyTorch-eager and ONNX Runtime peers of `tessera-encode`, for issue 3's benchmark.

The model is written here from the issue's description of the TESSERA v2 pixel
student (not copied from upstream), with PyTorch's own TransformerEncoderLayer
(post-LN, ReLU, packed in_proj), so that the tensor names are the checkpoint's.
`check` proves it is the same model as the fixtures' before it is timed.

    torch_peer.py check ../shared/fixtures/encoder/small ../shared/fixtures/encoder/long
    torch_peer.py bench --ckpt large.safetensors --tile TILE_DIR --threads 1,2 \
        [--batch 16,64,256] [--onnx model.onnx] [--reps 2]

Needs: torch, numpy, and for the ONNX column onnx and onnxruntime (pip).
Prints Markdown table rows; `scripts/bench-encoder-peers.sh` runs it next to
`tessera-encode bench` on the same checkpoint and tile.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

S2_MEAN = np.array([1633.0042, 1341.1090, 1539.5536, 3054.8269, 3117.4658, 2004.1648,
                    2694.7275, 2945.1504, 2266.6079, 1657.3094], dtype=np.float64)
S2_STD = np.array([1999.4603, 2014.7549, 1929.2201, 1754.2493, 1649.9807, 1936.8988,
                   1748.6041, 1708.6991, 1207.5250, 1108.6046], dtype=np.float64)
S1A_MEAN = np.array([5909.3921, 3405.0322]); S1A_STD = np.array([1507.1750, 1531.2615])
S1D_MEAN = np.array([5816.1382, 3277.7576]); S1D_STD = np.array([1554.6475, 1546.4733])


def load_safetensors(path):
    """f32 tensors and the `args` metadata of a .safetensors file (no extra package needed)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {info['dtype']}, expected F32")
        start, end = info["data_offsets"]
        arr = np.frombuffer(raw[8 + n + start:8 + n + end], dtype=np.float32).reshape(info["shape"])
        tensors[name] = torch.from_numpy(arr.copy())
    return tensors, json.loads(header["__metadata__"]["args"])


class AttnPool(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.query = nn.Linear(d, 1)

    def forward(self, x):  # x: (B, L, d)
        w = torch.softmax(self.query(x), dim=1)  # (B, L, 1)
        return (w * x).sum(dim=1)


class Backbone(nn.Module):
    def __init__(self, bands, d, layers, nhead, ffn):
        super().__init__()
        self.d = d
        self.embedding = nn.Sequential(nn.Linear(bands, d), nn.ReLU(), nn.Linear(d, d))
        layer = nn.TransformerEncoderLayer(d, nhead, ffn, dropout=0.0, batch_first=True)
        self.transformer_encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.attn_pool = AttnPool(d)
        i = torch.arange(0, d, 2, dtype=torch.float32)
        self.register_buffer("freq", torch.exp(-math.log(10000.0) * i / d), persistent=False)

    def forward(self, x, doy):  # x: (B, L, bands), doy: (B, L) f32
        h = self.embedding(x)
        angle = doy.unsqueeze(-1) * self.freq  # (B, L, d/2)
        pe = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(-2)  # sin even, cos odd
        h = self.transformer_encoder(h + pe)
        return self.attn_pool(h)


class PixelStudent(nn.Module):
    def __init__(self, args):
        super().__init__()
        d = 4 * args["latent_dim"]
        layers, nhead, ffn = args["num_layers"], args["nhead"], args["dim_feedforward"]
        self.s2_backbone = Backbone(10, d, layers, nhead, ffn)
        self.s1_backbone = Backbone(2, d, layers, nhead, ffn)
        self.dim_reducer = nn.Sequential(nn.Linear(2 * d, 4 * d), nn.LayerNorm(4 * d), nn.ReLU(),
                                         nn.Identity(), nn.Linear(4 * d, args.get("repr_dim", 128)))
        self.repr_dim = args.get("repr_dim", 128)

    def forward(self, s2, s2_doy, s1, s1_doy):
        z = torch.cat([self.s2_backbone(s2, s2_doy), self.s1_backbone(s1, s1_doy)], dim=-1)
        z = self.dim_reducer(z)
        return F.layer_norm(z, (self.repr_dim,))


def load_model(path):
    tensors, args = load_safetensors(path)
    model = PixelStudent(args).eval()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        sys.exit(f"{path}: missing {missing}, unexpected {unexpected}")
    return model, args


# ---- tokens, as the issue describes them ----

def bin_length(n):
    return min(256, max(8, -(-n // 8) * 8))


def sample_indices(n, b):
    if n >= b:
        return np.linspace(0, n - 1, b).astype(np.int64)
    r = b - n
    if r <= n:
        extra = [g[len(g) // 2] for g in np.array_split(np.arange(n), r)]
    else:
        extra = [i % n for i in range(r)]
    return np.concatenate([np.arange(n), np.array(extra, dtype=np.int64)])


def read_tile(d):
    t = lambda f: np.load(os.path.join(d, f))
    return dict(bands=t("bands.npy"), masks=t("masks.npy"), doys=t("doys.npy"),
                sa=t("sar_ascending.npy"), sad=t("sar_ascending_doy.npy"),
                sd=t("sar_descending.npy"), sdd=t("sar_descending_doy.npy"))


def pixel_tokens(tile):
    """Per pixel: (s2 x, s2 doy, s1 x, s1 doy, has_any) as numpy f32 arrays."""
    s2 = ((tile["bands"] - S2_MEAN) / (S2_STD + 1e-9)).astype(np.float32)
    s1 = np.concatenate([(tile["sa"] - S1A_MEAN) / (S1A_STD + 1e-9),
                         (tile["sd"] - S1D_MEAN) / (S1D_STD + 1e-9)], 0).astype(np.float32)
    s1_raw = np.concatenate([tile["sa"], tile["sd"]], 0)
    s1_doy = np.concatenate([tile["sad"], tile["sdd"]]).astype(np.float32)
    s2_doy = tile["doys"].astype(np.float32)
    _, height, width = tile["masks"].shape
    out = []
    for y in range(height):
        for x in range(width):
            v2 = np.nonzero(tile["masks"][:, y, x] == 1)[0]
            v1 = np.nonzero((s1_raw[:, y, x] != 0).any(-1))[0]
            if len(v2):
                i2 = v2[sample_indices(len(v2), bin_length(len(v2)))]
                t2, d2 = s2[i2, y, x], s2_doy[i2]
            else:
                t2, d2 = np.zeros((1, 10), np.float32), np.zeros(1, np.float32)
            if len(v1):
                i1 = v1[sample_indices(len(v1), bin_length(len(v1)))]
                t1, d1 = s1[i1, y, x], s1_doy[i1]
            else:
                t1, d1 = np.zeros((1, 2), np.float32), np.zeros(1, np.float32)
            out.append((t2, d2, t1, d1, bool(len(v2) or len(v1))))
    return out, (height, width)


def batches(tokens, batch):
    """Groups pixels of equal sequence lengths into batches of at most `batch`."""
    groups = {}
    for i, (t2, _, t1, _, _) in enumerate(tokens):
        groups.setdefault((len(t2), len(t1)), []).append(i)
    for idx in groups.values():
        for k in range(0, len(idx), batch):
            part = idx[k:k + batch]
            yield part, [np.stack([tokens[i][j] for i in part]) for j in range(4)]


def encode_torch(model, tokens, batch):
    out = np.empty((len(tokens), 128), np.float32)
    with torch.inference_mode():
        for part, arrays in batches(tokens, batch):
            out[part] = model(*[torch.from_numpy(a) for a in arrays]).numpy()
    return out


class OnnxPeer:
    """ONNX Runtime sessions of the exported model, one per (S2, S1) sequence-length pair.

    The TorchScript exporter bakes sequence lengths into MultiheadAttention's
    reshapes, so each bin pair gets its own graph (batch stays dynamic). A
    benchmark tile whose pixels all have the same number of observations uses
    exactly one.
    """

    def __init__(self, model, directory, threads):
        self.model, self.directory, self.threads, self.sessions = model, directory, threads, {}

    def session(self, l2, l1):
        if (l2, l1) not in self.sessions:
            path = os.path.join(self.directory, f"model_{l2}_{l1}.onnx")
            if not os.path.exists(path):
                export_onnx(self.model, path, (l2, l1))
            self.sessions[(l2, l1)] = onnx_session(path, self.threads)
        return self.sessions[(l2, l1)]


def encode_onnx(peer, tokens, batch):
    out = np.empty((len(tokens), 128), np.float32)
    for part, arrays in batches(tokens, batch):
        session = peer.session(arrays[0].shape[1], arrays[2].shape[1])
        names = [i.name for i in session.get_inputs()]
        out[part] = session.run(None, dict(zip(names, arrays)))[0]
    return out


def export_onnx(model, path, bins):
    l2, l1 = bins
    example = (torch.zeros(2, l2, 10), torch.zeros(2, l2), torch.zeros(2, l1, 2), torch.zeros(2, l1))
    dyn = {"s2": {0: "b"}, "s2_doy": {0: "b"}, "s1": {0: "b"}, "s1_doy": {0: "b"}, "emb": {0: "b"}}
    torch.onnx.export(model, example, path, input_names=["s2", "s2_doy", "s1", "s1_doy"],
                      output_names=["emb"], dynamic_axes=dyn, opset_version=17, dynamo=False)


def onnx_session(path, threads):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def compare(name, got, case_dir, tokens):
    expected = np.load(os.path.join(case_dir, "expected", "emb_f32.npy")).reshape(-1, 128)
    nodata = np.load(os.path.join(case_dir, "expected", "nodata.npy")).reshape(-1)
    keep = ~nodata
    g, e = got[keep].astype(np.float64), expected[keep].astype(np.float64)
    cos = (g * e).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(e, axis=1)
    err = np.abs(g - e).max()
    ok = cos.min() >= 0.99999 and err <= 1e-4
    print(f"{case_dir} [{name}]: worst cosine {cos.min():.9f}, max abs error {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
    return ok


def cmd_check(a):
    ok = True
    for case in a.cases:
        model, _ = load_model(os.path.join(case, "ckpt.safetensors"))
        tokens, _ = pixel_tokens(read_tile(os.path.join(case, "tile")))
        ok &= compare("torch eager", encode_torch(model, tokens, 64), case, tokens)
        if a.onnx:
            directory = os.path.join(a.onnx, os.path.basename(case.rstrip("/")))
            os.makedirs(directory, exist_ok=True)
            ok &= compare("onnxruntime", encode_onnx(OnnxPeer(model, directory, 1), tokens, 64), case, tokens)
    sys.exit(0 if ok else 1)


def pixel_flops(args, l2, l1):
    """Multiply-adds x 2 of every matrix product, as `tessera-encode bench` counts them."""
    d, ffn = 4 * args["latent_dim"], args["dim_feedforward"]
    def backbone(bands, length):
        per_token = 2 * (bands * d + d * d)
        per_layer = length * 2 * (3 * d * d + d * d + 2 * d * ffn) + 2 * 2 * length * length * d
        return length * per_token + args["num_layers"] * per_layer + 2 * length * d
    return backbone(10, l2) + backbone(2, l1) + 2 * (2 * d * 4 * d + 4 * d * 128)


def cmd_bench(a):
    model, args = load_model(a.ckpt)
    tokens, _ = pixel_tokens(read_tile(a.tile))
    flops = sum(pixel_flops(args, len(t[0]), len(t[2])) for t in tokens)
    if a.onnx:
        os.makedirs(a.onnx, exist_ok=True)
    print(f"# peers: torch {torch.__version__}, {len(tokens)} px, {flops / 1e9:.2f} GFLOP per tile")
    print("| peer | threads | batch | pixels/s | GFLOP/s |")
    print("|---|---|---|---|---|")
    for threads in a.threads:
        torch.set_num_threads(threads)
        runs = [("pytorch eager", lambda b: encode_torch(model, tokens, b))]
        if a.onnx:
            peer = OnnxPeer(model, a.onnx, threads)
            runs.append(("onnxruntime", lambda b, p=peer: encode_onnx(p, tokens, b)))
        for name, fn in runs:
            for batch in a.batch:
                fn(batch)  # warm-up: allocator, kernels, ORT's first-run planning
                best = float("inf")
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    fn(batch)
                    best = min(best, time.perf_counter() - t0)
                px = len(tokens) / best
                print(f"| {name} | {threads} | {batch} | {px:.2f} | {flops / best / 1e9:.1f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="compare with fixture cases (DIR holds ckpt.safetensors, tile/, expected/)")
    c.add_argument("cases", nargs="+")
    c.add_argument("--onnx", metavar="DIR", help="also export to DIR/CASE/*.onnx and check ONNX Runtime")
    b = sub.add_parser("bench", help="time the peers on a checkpoint and tile")
    b.add_argument("--ckpt", required=True)
    b.add_argument("--tile", required=True)
    b.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, os.cpu_count()])
    b.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[64])
    b.add_argument("--reps", type=int, default=2)
    b.add_argument("--onnx", metavar="DIR", help="export to DIR and time ONNX Runtime too")
    a = p.parse_args()
    cmd_check(a) if a.cmd == "check" else cmd_bench(a)


if __name__ == "__main__":
    main()
