// The GPU path's kernels besides the GEMMs (`KERNELS` in device.rs): NVRTC
// compiles them on a GPU; in tests the emulator compiles them as C++20.
// NVRTC has no standard headers: use only CUDA's built-in device functions.

// Row kernels (LayerNorm, softmax) give each row one warp: 32 lanes stride
// over its columns and reduce with butterfly shuffles (every lane ends with
// the same total, bit for bit, since a + b == b + a), so no shared memory
// and no __syncthreads. A block holds blockDim.x / 32 rows. A warp past
// the last row computes on the last row and writes nothing: every lane of
// a block takes part in every shuffle, which the emulator requires (it
// treats a shuffle as a barrier of the block).
#define FULL_MASK 0xffffffffu
#define WARP_SUM(v) for (int o_ = 16; o_ > 0; o_ >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o_)
#define WARP_MAX(v) for (int o_ = 16; o_ > 0; o_ >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o_))

// f32 to bf16 bits, to nearest, ties to even; NaN stays NaN. The same as
// device.rs's bf16_bits, and as cuBLAS rounds a bf16 result.
__device__ unsigned short to_bf16(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// h = x rounded to bf16, n elements, one thread each.
extern "C" __global__ void f32_to_bf16(const float* x, unsigned short* h, int n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = to_bf16(x[i]);
}

// y (rows, cols): + bias (per column; may be null), then ReLU if relu, then
// + residual (may be null). The result goes to y, and also as bf16 to half
// when half is not null; with half given and keep 0, only to half (the
// next GEMM reads it in bf16 and nothing reads the f32). Blocks of 256
// threads cover EPILOGUE_ROWS rows in ceil(cols / 256) segments, so a
// thread finds its column without a 64-bit division (the element-wise
// `i % cols` this replaces was most of the kernel's time on an H200).
#define EPILOGUE_ROWS 8
extern "C" __global__ void bias_epilogue(float* y, const float* bias, const float* residual,
                                         unsigned short* half, int rows, int cols, int relu,
                                         int keep) {
    int segments = (cols + blockDim.x - 1) / blockDim.x;
    int col = (blockIdx.x % segments) * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float b = bias ? bias[col] : 0.0f;
    // EPILOGUE_ROWS rows per block: a block's 256 threads each take one
    // column of them, so launching and retiring blocks does not bound the
    // kernel (one row per block was a third of the H200's bandwidth).
    int first = (blockIdx.x / segments) * EPILOGUE_ROWS;
    for (int r = 0; r < EPILOGUE_ROWS; r++) {
        int row = first + r;
        if (row >= rows) return;
        long long i = (long long)row * cols + col;
        float v = bias ? y[i] + b : y[i];
        if (relu) v = fmaxf(v, 0.0f);
        if (residual) v += residual[i];
        if (half) half[i] = to_bf16(v);
        if (!half || keep) y[i] = v;
    }
}

// The day-of-year encoding, as model::DoyEncoding computes it on the host
// (in double, rounded to float): channel 2i is sin(doy * f_i), 2i + 1 is
// cos(doy * f_i), f_i = exp(-ln(10000) * 2i / d). One thread per (row, i);
// d is even. With `table` (table_days rows of d, this kernel's own output
// for days 0, 1, ...), a whole day inside it is copied from there instead:
// the same bits without a double-precision exp, log and sincos per value
// (1.6 ms of a 4,096-px chunk's 64 ms on an H200). Other days (fractions,
// negatives, days past the table) are computed.
extern "C" __global__ void doy_encoding(float* out, const float* doys, int rows, int d,
                                        const float* table, int table_days) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int half = d / 2;
    if (k >= (long long)rows * half) return;
    long long row = k / half;
    int i = (int)(k % half);
    float day = doys[row];
    if (table && day >= 0.0f && day < (float)table_days && (float)(int)day == day) {
        const float* t = table + (long long)(int)day * d + 2 * i;
        out[row * d + 2 * i] = t[0];
        out[row * d + 2 * i + 1] = t[1];
        return;
    }
    double f = exp(-log(10000.0) * (double)(2 * i) / (double)d);
    double s, c;
    sincos((double)day * f, &s, &c);
    out[row * d + 2 * i] = (float)s;
    out[row * d + 2 * i + 1] = (float)c;
}

// LayerNorm of each row of x (rows, cols), in place, one warp per row:
// mean, then the mean of squared deviations (both summed in double), then
// (x - mean) / sqrt(var + eps) rounded to float, then * gamma + beta
// (gamma and beta may be null: no affine).
extern "C" __global__ void layer_norm(float* x, const float* gamma, const float* beta,
                                      int rows, int cols, float eps) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool live = row < rows;
    if (!live) row = rows - 1;
    float* r = x + row * cols;
    double s = 0.0;
    for (int j = lane; j < cols; j += 32) s += (double)r[j];
    WARP_SUM(s);
    double mean = s / cols;
    double q = 0.0;
    for (int j = lane; j < cols; j += 32) {
        double c = (double)r[j] - mean;
        q += c * c;
    }
    WARP_SUM(q);
    double inv = 1.0 / sqrt(q / cols + (double)eps);
    if (!live) return;
    for (int j = lane; j < cols; j += 32) {
        float v = (float)(((double)r[j] - mean) * inv);
        if (gamma) v = v * gamma[j] + beta[j];
        r[j] = v;
    }
}

// A post-LN encoder layer's `norm(x + sublayer(x))` in one launch: y is the
// sublayer's GEMM output (rows, cols), in place; bias may be null; residual
// is x (null: the GEMM added it, and the bias, already); half, when not null, also gets the result in bf16. Each lane sums
// v = y + bias + residual (in float, as bias_epilogue computes it) over its
// own columns, then layer_norm's passes run over them: the same bits as
// bias_epilogue then layer_norm, in one launch. A row of up to
// 32 * LN_PER_LANE columns stays in registers (the loops are unrolled, so
// v[k] is a register), so y and residual are read once and y written once:
// keeping the sum in y between passes cost a second write of the row and
// made each pass wait on the last (12.7 of a 4,096-px chunk's 64 ms on an
// H200, 2.7 times the traffic it needs). Wider rows take the loop below.
#define LN_PER_LANE 32
extern "C" __global__ void residual_layer_norm(float* y, const float* bias,
                                               const float* residual, const float* gamma,
                                               const float* beta, unsigned short* half,
                                               int rows, int cols, float eps) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool live = row < rows;
    if (!live) row = rows - 1;
    float* r = y + row * cols;
    const float* res = residual ? residual + row * cols : 0;
    if (cols <= 32 * LN_PER_LANE) {
        float v[LN_PER_LANE];
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < LN_PER_LANE; k++) {
            int j = lane + 32 * k;
            if (j < cols) {
                float x = bias ? r[j] + bias[j] : r[j];
                if (res) x += res[j];
                v[k] = x;
                s += (double)x;
            }
        }
        WARP_SUM(s);
        double mean = s / cols;
        double q = 0.0;
#pragma unroll
        for (int k = 0; k < LN_PER_LANE; k++) {
            if (lane + 32 * k < cols) {
                double c = (double)v[k] - mean;
                q += c * c;
            }
        }
        WARP_SUM(q);
        double inv = 1.0 / sqrt(q / cols + (double)eps);
        if (!live) return;
#pragma unroll
        for (int k = 0; k < LN_PER_LANE; k++) {
            int j = lane + 32 * k;
            if (j < cols) {
                float o = (float)(((double)v[k] - mean) * inv);
                if (gamma) o = o * gamma[j] + beta[j];
                r[j] = o;
                if (half) half[row * cols + j] = to_bf16(o);
            }
        }
        return;
    }
    double s = 0.0;
    for (int j = lane; j < cols; j += 32) {
        float v = bias ? r[j] + bias[j] : r[j];
        if (res) v += res[j];
        if (live) r[j] = v;
        s += (double)v;
    }
    WARP_SUM(s);
    double mean = s / cols;
    double q = 0.0;
    // A warp past the last row read values the row's own warp may be
    // rewriting; it writes nothing, so what it computes does not matter.
    for (int j = lane; j < cols; j += 32) {
        double c = (double)r[j] - mean;
        q += c * c;
    }
    WARP_SUM(q);
    double inv = 1.0 / sqrt(q / cols + (double)eps);
    if (!live) return;
    for (int j = lane; j < cols; j += 32) {
        float v = (float)(((double)r[j] - mean) * inv);
        if (gamma) v = v * gamma[j] + beta[j];
        r[j] = v;
        if (half) half[row * cols + j] = to_bf16(v);
    }
}

// Softmax of each row of x (rows, cols): in place, or only as bf16 into
// half when half is not null. Each row has a group of `group` lanes (a
// power of two up to 32, from softmax_group on the host), so a block of
// blockDim.x threads holds blockDim.x / group rows and a group reduces
// with shuffles inside itself (partners lane ^ o, o < group). The host
// gives rows of up to SOFTMAX_PER_LANE values a lane: they are read once
// into registers and each exp is taken once. Attention's rows are short
// (64 scores on the Large model): a warp to a row spent its time waiting
// on one row's loads and shuffles (3.3 of a 4,096-px chunk's 64 ms on an
// H200); eight lanes to a row keep four rows' loads in flight per warp.
// Wider rows than the registers hold take the loops below.
#define SOFTMAX_PER_LANE 8
#define GROUP_SUM(v, g) for (int o_ = (g) >> 1; o_ > 0; o_ >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o_)
#define GROUP_MAX(v, g) for (int o_ = (g) >> 1; o_ > 0; o_ >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o_))
extern "C" __global__ void softmax_rows(float* x, unsigned short* half, int rows, int cols,
                                        int group) {
    int lane = threadIdx.x & (group - 1);
    long long row = (long long)blockIdx.x * (blockDim.x / group) + threadIdx.x / group;
    bool live = row < rows;
    if (!live) row = rows - 1;
    float* r = x + row * cols;
    unsigned short* h = half ? half + row * cols : 0;
    float m = __int_as_float(0xff800000);  // -inf; NVRTC has no INFINITY
    float s = 0.0f;
    if (cols <= group * SOFTMAX_PER_LANE) {
        float v[SOFTMAX_PER_LANE];
#pragma unroll
        for (int k = 0; k < SOFTMAX_PER_LANE; k++) {
            int j = lane + group * k;
            if (j < cols) {
                v[k] = r[j];
                m = fmaxf(m, v[k]);
            }
        }
        GROUP_MAX(m, group);
#pragma unroll
        for (int k = 0; k < SOFTMAX_PER_LANE; k++) {
            if (lane + group * k < cols) {
                v[k] = expf(v[k] - m);
                s += v[k];
            }
        }
        GROUP_SUM(s, group);
        if (!live) return;
        float inv = 1.0f / s;
#pragma unroll
        for (int k = 0; k < SOFTMAX_PER_LANE; k++) {
            int j = lane + group * k;
            if (j < cols) {
                if (h) h[j] = to_bf16(v[k] * inv);
                else r[j] = v[k] * inv;
            }
        }
        return;
    }
    for (int j = lane; j < cols; j += group) m = fmaxf(m, r[j]);
    GROUP_MAX(m, group);
    for (int j = lane; j < cols; j += group) s += expf(r[j] - m);
    GROUP_SUM(s, group);
    if (!live) return;
    float inv = 1.0f / s;
    for (int j = lane; j < cols; j += group) {
        float p = expf(r[j] - m) * inv;
        if (h) h[j] = to_bf16(p);
        else r[j] = p;
    }
}

// Attention pooling: one block per pixel; h is (pixels, len, d). Pixel i's
// d features go to out at row out_rows[i] (row i if out_rows is null), rows
// out_ld floats apart, from column out_col: (pixels, d) features as they
// are, or into a window's (pixels, S2 then S1) rows that the head reads
// where they are. Shared memory: len floats of weights. Each token's score is one warp's
// dot product (its lanes read the token's row together, and shuffle-sum),
// the warps taking tokens in turn; every warp runs every round, past the
// last token on the last one, writing nothing (shuffles need the whole
// block). A thread to a token, reading its row alone, left most of each
// load's bytes unused (2.3 of a 4,096-px chunk's 64 ms on an H200).
extern "C" __global__ void attention_pool(const float* h, const float* w, float b,
                                          float* out, const int* out_rows, int out_ld,
                                          int out_col, int len, int d) {
    extern __shared__ float weights[];
    const float* hp = h + (long long)blockIdx.x * len * d;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int warps = blockDim.x >> 5;
    for (int t0 = 0; t0 < len; t0 += warps) {
        int t = t0 + warp;
        const float* row = hp + (long long)(t < len ? t : len - 1) * d;
        float s = 0.0f;
        for (int j = lane; j < d; j += 32) s += row[j] * w[j];
        WARP_SUM(s);
        if (t < len && lane == 0) weights[t] = s + b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = __int_as_float(0xff800000);
        for (int t = 0; t < len; ++t) m = fmaxf(m, weights[t]);
        float s = 0.0f;
        for (int t = 0; t < len; ++t) { weights[t] = expf(weights[t] - m); s += weights[t]; }
        float inv = 1.0f / s;
        for (int t = 0; t < len; ++t) weights[t] *= inv;
    }
    __syncthreads();
    long long row = out_rows ? out_rows[blockIdx.x] : blockIdx.x;
    float* op = out + row * out_ld + out_col;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < len; ++t) acc += weights[t] * hp[(long long)t * d + j];
        op[j] = acc;
    }
}

// Attention on tensor cores, for the bf16 backbones (sm_80 and later; the
// host launches it only there). One block of ATT_ROWS / 16 warps per
// (pixel, head, ATT_ROWS query rows); each warp carries 16 query rows
// through every key, ATT_KEYS keys at a time, with the scores, the running
// softmax (a maximum and a sum per row, the output rescaled when the
// maximum grows) and the output in registers: the scores never go through
// memory, which the two batched GEMMs and softmax_rows between them did
// (7.6 of a 4,096-px chunk's 64 ms on an H200, mostly traffic).
//
// qkv is the packed (pixels * len, 3d) bf16 projection (Q, K, V side by
// side, head h at columns h * hd of each); out, (pixels * len, d) bf16,
// gets head h's output at columns h * hd. Arithmetic: Q K^T in f32 from
// bf16 Q and K, times scale; the softmax in f32; its weights rounded to
// bf16 for P V (unnormalised: exp(s - running max)), accumulated in f32,
// divided by the f32 sum at the end, rounded once to bf16. Keys past len
// get weight 0; the head size is padded with zeros to a multiple of 16.
//
// Shared memory: the block's Q rows and a block of keys' K, rows of ld
// (the padded head size plus 8, so that a warp's fragment reads fall in
// distinct banks), and V transposed (a row per head dimension, ATT_KEYS +
// 8 keys wide), so every fragment is read as 32-bit pairs.
//
// The tensor-core instruction is mma.sync m16n8k16 (bf16 in, f32 out), on
// fragments laid out as PTX defines them: with g = lane / 4, q = lane % 4,
// A (16 x 16, row-major) reg 0 holds (row g, cols 2q, 2q+1), reg 1 (row
// g+8, same cols), reg 2 (row g, cols 2q+8, 2q+9), reg 3 (row g+8, those);
// B (16 x 8, k x n) reg 0 holds (k 2q, 2q+1; col g), reg 1 (k 2q+8, 2q+9;
// col g); C/D (16 x 8) holds (row g, cols 2q, 2q+1), then (row g+8, cols
// 2q, 2q+1); the lower-numbered element of a pair in the low 16 bits. So
// the scores of two adjacent 8-key tiles are, as they lie, the A fragment
// of the 16 keys they cover, for P V. The emulator runs the instruction
// from those same layouts.
#define ATT_ROWS 64
#define ATT_KEYS 32
#define ATT_MAX_HD 160
#define ATT_VT_LD (ATT_KEYS + 8)
#if defined(EMU_GPU)
// The emulator's copies trap on an address a GPU would fault on.
#define MMA_BF16(d, a, b) EMU_MMA_BF16(d, a, b)
__device__ unsigned ld_bf16x2(const unsigned short* p) {
    if ((unsigned long long)p & 3) __trap();
    unsigned v;
    __builtin_memcpy(&v, p, 4);
    return v;
}
#else
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ void mma_bf16(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#define MMA_BF16(d, a, b) mma_bf16(d, a, b)
#else
// Below sm_80 there is no bf16 mma: never launched there.
#define MMA_BF16(d, a, b) __trap()
#endif
// Two adjacent bf16 values (4-byte aligned) as one 32-bit word.
__device__ unsigned ld_bf16x2(const unsigned short* p) {
    return *reinterpret_cast<const unsigned*>(p);
}
#endif
__device__ unsigned pack_bf16x2(float lo, float hi) {
    return (unsigned)to_bf16(lo) | ((unsigned)to_bf16(hi) << 16);
}
// Eight bf16 values at src (16-byte aligned) as four 32-bit words, in one
// 16-byte load; and back to dst (the same). The emulator copies bytes.
__device__ void ld_bf16x8(unsigned* w, const unsigned short* src) {
#if defined(EMU_GPU)
    if ((unsigned long long)src & 15) __trap();
    __builtin_memcpy(w, src, 16);
#else
    uint4 v = *reinterpret_cast<const uint4*>(src);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
#endif
}
__device__ void st_bf16x8(unsigned short* dst, const unsigned* w) {
#if defined(EMU_GPU)
    if ((unsigned long long)dst & 15) __trap();
    __builtin_memcpy(dst, w, 16);
#else
    uint4 v;
    v.x = w[0];
    v.y = w[1];
    v.z = w[2];
    v.w = w[3];
    *reinterpret_cast<uint4*>(dst) = v;
#endif
}
extern "C" __global__ void attention_mma(const unsigned short* qkv, unsigned short* out,
                                         int len, int d, int nhead, float scale) {
    // Declared as uint4 so that it is 16-byte aligned, for the 16-byte
    // copies into Q and K.
    extern __shared__ uint4 att_smem_v[];
    unsigned short* att_smem = reinterpret_cast<unsigned short*>(att_smem_v);
    const int hd = d / nhead;
    // Wider heads than the registers hold (the host launches none).
    if (hd > ATT_MAX_HD) __trap();
    const int hdp = (hd + 15) & ~15;
    const int ld = hdp + 8;
    const int q_tiles = (len + ATT_ROWS - 1) / ATT_ROWS;
    const int qt = (int)(blockIdx.x % (unsigned)q_tiles);
    const long long ph = blockIdx.x / (unsigned)q_tiles;
    const int h = (int)(ph % nhead);
    const long long p = ph / nhead;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const long long d3 = 3LL * d;
    const unsigned short* tok0 = qkv + p * len * d3 + (long long)h * hd;
    unsigned short* qs = att_smem;              // ATT_ROWS x ld
    unsigned short* ks = qs + ATT_ROWS * ld;    // ATT_KEYS x ld
    unsigned short* vt = ks + ATT_KEYS * ld;    // hdp x ATT_VT_LD
    // Rows and head columns in 16-byte pieces where they are 16-byte
    // aligned (hd and d multiples of 8: every model published), else one
    // value at a time; zeros past len and hd.
    const bool wide = (hd & 7) == 0 && (d & 7) == 0;
    const int row0 = qt * ATT_ROWS;
    if (wide) {
        for (int i = threadIdx.x; i < ATT_ROWS * (hdp / 8); i += blockDim.x) {
            int r = i / (hdp / 8), c = (i - r * (hdp / 8)) * 8;
            int t = row0 + r;
            unsigned w[4] = {0u, 0u, 0u, 0u};
            if (t < len && c < hd) ld_bf16x8(w, tok0 + t * d3 + c);
            st_bf16x8(qs + r * ld + c, w);
        }
    } else {
        for (int i = threadIdx.x; i < ATT_ROWS * hdp; i += blockDim.x) {
            int r = i / hdp, c = i - r * hdp;
            int t = row0 + r;
            qs[r * ld + c] = t < len && c < hd ? tok0[t * d3 + c] : (unsigned short)0;
        }
    }
    const unsigned short* qw = qs + (warp * 16 + g) * ld + 2 * q;  // this lane's A reads
    const int r0 = row0 + warp * 16 + g;  // this lane's rows: r0, r0 + 8
    const float neg_inf = __int_as_float(0xff800000);
    float m0 = neg_inf, m1 = neg_inf, l0 = 0.0f, l1 = 0.0f;
    float o[ATT_MAX_HD / 8][4];
#pragma unroll
    for (int j = 0; j < ATT_MAX_HD / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    for (int kb = 0; kb < len; kb += ATT_KEYS) {
        __syncthreads();  // Q is in; the previous keys' last reads are done
        if (wide) {
            for (int i = threadIdx.x; i < ATT_KEYS * (hdp / 8); i += blockDim.x) {
                int key = i / (hdp / 8), c = (i - key * (hdp / 8)) * 8;
                int t = kb + key;
                unsigned kw[4] = {0u, 0u, 0u, 0u}, vw[4] = {0u, 0u, 0u, 0u};
                if (t < len && c < hd) {
                    ld_bf16x8(kw, tok0 + t * d3 + d + c);
                    ld_bf16x8(vw, tok0 + t * d3 + 2 * d + c);
                }
                st_bf16x8(ks + key * ld + c, kw);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    vt[(c + 2 * e) * ATT_VT_LD + key] = (unsigned short)(vw[e] & 0xffffu);
                    vt[(c + 2 * e + 1) * ATT_VT_LD + key] = (unsigned short)(vw[e] >> 16);
                }
            }
        } else {
            for (int i = threadIdx.x; i < ATT_KEYS * hdp; i += blockDim.x) {
                int key = i / hdp, c = i - key * hdp;
                int t = kb + key;
                bool live = t < len && c < hd;
                ks[key * ld + c] = live ? tok0[t * d3 + d + c] : (unsigned short)0;
                vt[c * ATT_VT_LD + key] = live ? tok0[t * d3 + 2 * d + c] : (unsigned short)0;
            }
        }
        __syncthreads();
        // Scores of this warp's 16 rows against the ATT_KEYS keys.
        float s[ATT_KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < ATT_KEYS / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < ATT_MAX_HD / 16; ++kk) {
            if (kk * 16 < hdp) {
                const unsigned short* qk = qw + kk * 16;
                unsigned a[4] = {ld_bf16x2(qk), ld_bf16x2(qk + 8 * ld), ld_bf16x2(qk + 8),
                                 ld_bf16x2(qk + 8 * ld + 8)};
#pragma unroll
                for (int j = 0; j < ATT_KEYS / 8; ++j) {
                    const unsigned short* kr = ks + (8 * j + g) * ld + kk * 16 + 2 * q;
                    unsigned b[2] = {ld_bf16x2(kr), ld_bf16x2(kr + 8)};
                    MMA_BF16(s[j], a, b);
                }
            }
        }
        // Scale, mask the keys past len, and the rows' maxima (a row's
        // values lie in the four lanes of its quad).
        float x0 = neg_inf, x1 = neg_inf;
#pragma unroll
        for (int j = 0; j < ATT_KEYS / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = kb + 8 * j + 2 * q + (e & 1);
                s[j][e] = key < len ? s[j][e] * scale : neg_inf;
            }
            x0 = fmaxf(x0, fmaxf(s[j][0], s[j][1]));
            x1 = fmaxf(x1, fmaxf(s[j][2], s[j][3]));
        }
        x0 = fmaxf(x0, __shfl_xor_sync(FULL_MASK, x0, 1));
        x0 = fmaxf(x0, __shfl_xor_sync(FULL_MASK, x0, 2));
        x1 = fmaxf(x1, __shfl_xor_sync(FULL_MASK, x1, 1));
        x1 = fmaxf(x1, __shfl_xor_sync(FULL_MASK, x1, 2));
        // Key kb is live, so the new maxima are finite; exp(-inf) is 0 on
        // the first keys.
        float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        float c0 = expf(m0 - n0), c1 = expf(m1 - n1);
        m0 = n0;
        m1 = n1;
        l0 *= c0;
        l1 *= c1;
#pragma unroll
        for (int j = 0; j < ATT_KEYS / 8; ++j) {
            s[j][0] = expf(s[j][0] - m0);
            s[j][1] = expf(s[j][1] - m0);
            s[j][2] = expf(s[j][2] - m1);
            s[j][3] = expf(s[j][3] - m1);
            l0 += s[j][0] + s[j][1];
            l1 += s[j][2] + s[j][3];
        }
#pragma unroll
        for (int j = 0; j < ATT_MAX_HD / 8; ++j) {
            o[j][0] *= c0;
            o[j][1] *= c0;
            o[j][2] *= c1;
            o[j][3] *= c1;
        }
        // O += P V, 16 keys at a time.
#pragma unroll
        for (int kk = 0; kk < ATT_KEYS / 16; ++kk) {
            unsigned pa[4] = {
                pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]),
            };
#pragma unroll
            for (int j = 0; j < ATT_MAX_HD / 8; ++j) {
                if (j * 8 < hdp) {
                    const unsigned short* vc = vt + (8 * j + g) * ATT_VT_LD + 16 * kk + 2 * q;
                    unsigned b[2] = {ld_bf16x2(vc), ld_bf16x2(vc + 8)};
                    MMA_BF16(o[j], pa, b);
                }
            }
        }
    }
    l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    unsigned short* ob = out + p * len * d + (long long)h * hd;
#pragma unroll
    for (int j = 0; j < ATT_MAX_HD / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int row = r0 + 8 * (e >> 1);
            int col = 8 * j + 2 * q + (e & 1);
            if (row < len && col < hd) ob[(long long)row * d + col] = to_bf16(o[j][e] * (e < 2 ? inv0 : inv1));
        }
    }
}
