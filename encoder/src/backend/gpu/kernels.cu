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
// d is even.
extern "C" __global__ void doy_encoding(float* out, const float* doys, int rows, int d) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int half = d / 2;
    if (k >= (long long)rows * half) return;
    long long row = k / half;
    int i = (int)(k % half);
    double f = exp(-log(10000.0) * (double)(2 * i) / (double)d);
    double s, c;
    sincos((double)doys[row] * f, &s, &c);
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
// is x; half, when not null, also gets the result in bf16. Each lane first stores v = y + bias + residual (in float, as
// bias_epilogue computes it) over its own columns, then layer_norm's
// passes run over them: the same bits as bias_epilogue then layer_norm,
// one launch instead of two and the row still in L1 for the later passes.
extern "C" __global__ void residual_layer_norm(float* y, const float* bias,
                                               const float* residual, const float* gamma,
                                               const float* beta, unsigned short* half,
                                               int rows, int cols, float eps) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool live = row < rows;
    if (!live) row = rows - 1;
    float* r = y + row * cols;
    const float* res = residual + row * cols;
    double s = 0.0;
    for (int j = lane; j < cols; j += 32) {
        float v = bias ? r[j] + bias[j] : r[j];
        v += res[j];
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

// Softmax of each row of x (rows, cols), one warp per row: in place, or
// only as bf16 into half when half is not null.
extern "C" __global__ void softmax_rows(float* x, unsigned short* half, int rows, int cols) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool live = row < rows;
    if (!live) row = rows - 1;
    float* r = x + row * cols;
    float m = __int_as_float(0xff800000);  // -inf; NVRTC has no INFINITY
    for (int j = lane; j < cols; j += 32) m = fmaxf(m, r[j]);
    WARP_MAX(m);
    float s = 0.0f;
    for (int j = lane; j < cols; j += 32) s += expf(r[j] - m);
    WARP_SUM(s);
    if (!live) return;
    float inv = 1.0f / s;
    if (half) {
        unsigned short* h = half + row * cols;
        for (int j = lane; j < cols; j += 32) h[j] = to_bf16(expf(r[j] - m) * inv);
    } else {
        for (int j = lane; j < cols; j += 32) r[j] = expf(r[j] - m) * inv;
    }
}

// Attention pooling: one block per pixel; h is (pixels, len, d), out (pixels, d).
// Shared memory: len floats of weights.
extern "C" __global__ void attention_pool(const float* h, const float* w, float b,
                                          float* out, int len, int d) {
    extern __shared__ float weights[];
    const float* hp = h + (long long)blockIdx.x * len * d;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        float s = b;
        for (int j = 0; j < d; ++j) s += hp[(long long)t * d + j] * w[j];
        weights[t] = s;
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
