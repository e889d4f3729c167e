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

// Attention pooling: one block per pixel; h is (pixels, len, d), out (pixels, d).
// Shared memory: len floats of weights. Each token's score is one warp's
// dot product (its lanes read the token's row together, and shuffle-sum),
// the warps taking tokens in turn; every warp runs every round, past the
// last token on the last one, writing nothing (shuffles need the whole
// block). A thread to a token, reading its row alone, left most of each
// load's bytes unused (2.3 of a 4,096-px chunk's 64 ms on an H200).
extern "C" __global__ void attention_pool(const float* h, const float* w, float b,
                                          float* out, int len, int d) {
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
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < len; ++t) acc += weights[t] * hp[(long long)t * d + j];
        out[(long long)blockIdx.x * d + j] = acc;
    }
}
