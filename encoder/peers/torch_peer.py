#!/usr/bin/env python3
"""PyTorch-eager and ONNX Runtime peers of `tessera-encode`, for issue 3's benchmark.

The model is written here from the issue's description of the TESSERA v2 pixel
student (not copied from upstream), with PyTorch's own TransformerEncoderLayer
(post-LN, ReLU, packed in_proj), so that the tensor names are the checkpoint's.
`check` proves it is the same model as the fixtures' before it is timed.

    torch_peer.py check ../shared/fixtures/encoder/small ../shared/fixtures/encoder/long
    torch_peer.py bench --ckpt large.safetensors --tile TILE_DIR --threads 1,2 \
        [--batch 16,64,256] [--onnx model.onnx] [--reps 2]
    torch_peer.py tile --ckpt large.safetensors --tile TILE_DIR [--device cuda] \
        [--dtype fp32,tf32,bf16] [--mode whole,forward] [--chunk 4096[,1024,...]] [--compile bf16] \
        [--out-dir DIR]

`tile` is issue 16's peer: the whole tile as one run of an encoder would do it
(read the .npy files, prepare tokens, group by sequence length, forward in
chunks, embeddings back on the host: "whole") and the forward pass alone on
inputs already on the device ("forward"), on CUDA or the CPU, in fp32, tf32
or bf16 (autocast); `--compile bf16` adds torch.compile's forward pass in
bf16 (each precision compiles anew, a minute or so on a GPU).

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
    return backbone_flops(args, 10, l2) + backbone_flops(args, 2, l1) + head_flops(args)


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


# ---- issue 16: the whole tile, on a GPU or the CPU ----

def prepare_modality(valid, values, doy):
    """Tokens of one modality for every pixel, vectorised.

    valid (T, P) bool, values (T, P, bands) f32 standardised, doy (T,) f32.
    Returns {length: (pixels, x (n, length, bands), doy (n, length))}: the
    valid frames in file order, filled or subsampled as `sample_indices`
    does, grouped by bin length; a pixel with no valid frame is one zero
    token.
    """
    counts = valid.sum(0)
    # Valid frames first, each in file order (a stable sort of "not valid").
    order = np.argsort(~valid, axis=0, kind="stable")
    bands = values.shape[2]
    groups = {}
    for n in np.unique(counts):
        px = np.nonzero(counts == n)[0]
        if n == 0:
            x = np.zeros((len(px), 1, bands), np.float32)
            d = np.zeros((len(px), 1), np.float32)
        else:
            length = bin_length(int(n))
            frames = order[sample_indices(int(n), length)][:, px]  # (length, n_px)
            x = values[frames, px[None, :]].transpose(1, 0, 2)
            d = doy[frames].T
        groups.setdefault(x.shape[1], []).append((px, x, d))
    return {length: (np.concatenate([g[0] for g in parts]),
                     np.concatenate([g[1] for g in parts]),
                     np.concatenate([g[2] for g in parts]))
            for length, parts in groups.items()}


def prepare_tile(tile):
    """(S2 groups, S1 groups, has_data (P,), (height, width)) for a tile read by `read_tile`."""
    t, height, width = tile["masks"].shape
    p = height * width
    s2_valid = (tile["masks"] == 1).reshape(t, p)
    s2 = ((tile["bands"].reshape(t, p, 10) - S2_MEAN) / (S2_STD + 1e-9)).astype(np.float32)
    s1_raw = np.concatenate([tile["sa"], tile["sd"]], 0)
    t1 = s1_raw.shape[0]
    s1_valid = (s1_raw != 0).any(-1).reshape(t1, p)
    s1 = np.concatenate([(tile["sa"] - S1A_MEAN) / (S1A_STD + 1e-9),
                         (tile["sd"] - S1D_MEAN) / (S1D_STD + 1e-9)], 0).astype(np.float32)
    s1_doy = np.concatenate([tile["sad"], tile["sdd"]]).astype(np.float32)
    g2 = prepare_modality(s2_valid, s2, tile["doys"].astype(np.float32))
    g1 = prepare_modality(s1_valid, s1.reshape(t1, p, 2), s1_doy)
    has = s2_valid.any(0) | s1_valid.any(0)
    return g2, g1, has, (height, width)


def set_precision(dtype):
    """fp32: exact f32 GEMMs; tf32: TF32 tensor cores; bf16: TF32 off, bf16 by autocast."""
    tf32 = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def autocast(device, dtype):
    if dtype == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return torch.autocast(device_type=device, enabled=False)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def chunks_of(groups, chunk, device):
    """Per (length): the pixel chunks' (pixels, x, doy) with x and doy on `device`."""
    out = []
    for length in sorted(groups):
        px, x, d = groups[length]
        for k in range(0, len(px), chunk):
            out.append((px[k:k + chunk],
                        torch.from_numpy(np.ascontiguousarray(x[k:k + chunk])).to(device, non_blocking=True),
                        torch.from_numpy(np.ascontiguousarray(d[k:k + chunk])).to(device, non_blocking=True)))
    return out


def run_forward(model, s2_chunks, s1_chunks, p, chunk, device, dtype, backbones=None):
    """Pooled features of every chunk, then the head in chunks: (P, repr) on the device."""
    s2_bb, s1_bb = backbones or (model.s2_backbone, model.s1_backbone)
    d = model.s2_backbone.d
    pooled = torch.zeros((2, p, d), device=device)
    with torch.inference_mode(), autocast(device, dtype):
        for i, (bb, parts) in enumerate([(s2_bb, s2_chunks), (s1_bb, s1_chunks)]):
            for px, x, doy in parts:
                pooled[i, torch.from_numpy(px).to(device)] = bb(x, doy).float()
        out = torch.empty((p, model.repr_dim), device=device)
        for k in range(0, p, chunk):
            z = model.dim_reducer(torch.cat([pooled[0, k:k + chunk], pooled[1, k:k + chunk]], -1))
            out[k:k + chunk] = F.layer_norm(z.float(), (model.repr_dim,))
    return out


def encode_whole(model, tile_dir, chunk, device, dtype):
    """Everything one tile costs: read, prepare, copy, forward, embeddings to the host."""
    g2, g1, has, (h, w) = prepare_tile(read_tile(tile_dir))
    p = h * w
    out = run_forward(model, chunks_of(g2, chunk, device), chunks_of(g1, chunk, device),
                      p, chunk, device, dtype).cpu().numpy()
    out[~has] = np.nan
    return out.reshape(h, w, -1)


def cmd_tile(a):
    device = a.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("tile: --device cuda but torch sees no GPU")
    if device == "cpu" and a.threads:
        torch.set_num_threads(a.threads)
    model, args = load_model(a.ckpt)
    model = model.to(device)
    tile = read_tile(a.tile)
    g2, g1, has, (h, w) = prepare_tile(tile)
    p = h * w
    # FLOPs as `tessera-encode bench` counts them: each modality's backbone at
    # its own length, plus the head, for pixels with data.
    flops = 0.0
    for groups, bands in ((g2, 10), (g1, 2)):
        for length, (px, _, _) in groups.items():
            flops += backbone_flops(args, bands, length) * int(has[px].sum())
    flops += head_flops(args) * int(has.sum())
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(f"# torch {torch.__version__} on {name}: {h} x {w} px ({int(has.sum())} with data), "
          f"{flops / max(1, has.sum()) / 1e9:.2f} GFLOP per pixel, chunk {','.join(map(str, a.chunk))}", flush=True)
    print("| peer | dtype | mode | seconds | pixels/s | TFLOP/s |")
    print("|---|---|---|---|---|---|", flush=True)
    n = int(has.sum())
    several = len(a.chunk) > 1
    # torch.compile's runs come after every precision's eager ones: its
    # compilation takes the longest, and a caller that cuts the peer short
    # (scripts/gpu-check.sh keeps to a time budget) keeps the eager rows.
    passes = [(dtype, False) for dtype in a.dtype] + [(dtype, True) for dtype in a.dtype if dtype in a.compile]
    for dtype, compile_pass in passes:
        set_precision(dtype)
        best_of = {}  # (peer, mode) -> (seconds, chunk): PyTorch's best chunk is its figure
        for chunk in a.chunk:
            runs = []
            if "whole" in a.mode and not compile_pass:
                runs.append(("pytorch encode_tile", "whole",
                             lambda chunk=chunk: encode_whole(model, a.tile, chunk, device, dtype)))
            if ("forward" in a.mode and not compile_pass) or compile_pass:
                s2c, s1c = chunks_of(g2, chunk, device), chunks_of(g1, chunk, device)
                sync(device)
                if "forward" in a.mode and not compile_pass:
                    runs.append(("pytorch forward", "forward",
                                 lambda s2c=s2c, s1c=s1c, chunk=chunk: run_forward(model, s2c, s1c, p, chunk,
                                                                                   device, dtype)))
                if compile_pass:
                    compiled = (torch.compile(model.s2_backbone), torch.compile(model.s1_backbone))
                    runs.append(("torch.compile forward", "forward",
                                 lambda s2c=s2c, s1c=s1c, c=compiled, chunk=chunk: run_forward(
                                     model, s2c, s1c, p, chunk, device, dtype, c)))
            for peer, mode, fn in runs:
                result = fn()  # warm-up: context, kernels, autotuning, compilation
                sync(device)
                best = float("inf")
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    result = fn()
                    sync(device)
                    best = min(best, time.perf_counter() - t0)
                label = f"{peer} (chunk {chunk})" if several else peer
                print(f"| {label} | {dtype} | {mode} | {best:.3f} | {n / best:.0f} | {flops / best / 1e12:.1f} |",
                      flush=True)
                if best < best_of.get((peer, mode), (float("inf"), 0))[0]:
                    best_of[(peer, mode)] = (best, chunk)
                if a.out_dir and mode == "whole":
                    os.makedirs(a.out_dir, exist_ok=True)
                    np.save(os.path.join(a.out_dir, f"torch_{dtype}.npy"), result.astype(np.float32))
        if several:
            # The peer at its best chunk, under the plain name that the
            # tables (scripts/gpu-check.sh) read.
            for (peer, mode), (best, chunk) in best_of.items():
                print(f"| {peer} | {dtype} | {mode} (best: chunk {chunk}) | {best:.3f} | {n / best:.0f} | "
                      f"{flops / best / 1e12:.1f} |", flush=True)


def backbone_flops(args, bands, length):
    d, ffn = 4 * args["latent_dim"], args["dim_feedforward"]
    per_token = 2 * (bands * d + d * d)
    per_layer = length * 2 * (3 * d * d + d * d + 2 * d * ffn) + 2 * 2 * length * length * d
    return length * per_token + args["num_layers"] * per_layer + 2 * length * d


def head_flops(args):
    d = 4 * args["latent_dim"]
    return 2 * (2 * d * 4 * d + 4 * d * args.get("repr_dim", 128))


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
    t = sub.add_parser("tile", help="issue 16: the whole tile and the forward pass alone, on cuda or cpu")
    t.add_argument("--ckpt", required=True)
    t.add_argument("--tile", required=True)
    t.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    t.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    t.add_argument("--dtype", type=lambda s: s.split(","), default=["fp32", "tf32", "bf16"])
    t.add_argument("--mode", type=lambda s: s.split(","), default=["whole", "forward"])
    t.add_argument("--chunk", type=lambda s: [int(x) for x in s.split(",")], default=[4096],
                   help="pixels per forward call; several (64,256,1024) time each and add a row for the best")
    t.add_argument("--compile", type=lambda s: s.split(","), default=[], metavar="DTYPES",
                   help="also time torch.compile's forward pass in these precisions (e.g. bf16)")
    t.add_argument("--reps", type=int, default=1)
    t.add_argument("--out-dir", help="save each whole-tile embedding as DIR/torch_DTYPE.npy (H, W, 128) f32")
    a = p.parse_args()
    {"check": cmd_check, "bench": cmd_bench, "tile": cmd_tile}[a.cmd](a)


if __name__ == "__main__":
    main()
