// The GPU path's kernels besides the GEMMs (`KERNELS` in device.rs): NVRTC
// compiles them on a GPU; in tests the emulator compiles them as C++20.
// NVRTC has no standard headers: use only CUDA's built-in device functions.

// bias and residual may be null (no add).
extern "C" __global__ void bias_epilogue(float* y, const float* bias, const float* residual,
                                         int rows, int cols, int relu) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)rows * cols;
    if (i >= total) return;
    float v = bias ? y[i] + bias[i % cols] : y[i];
    if (relu) v = fmaxf(v, 0.0f);
    if (residual) v += residual[i];
    y[i] = v;
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

// One block per row of `cols`; gamma/beta may be null (no affine).
// Shared memory: blockDim.x doubles.
extern "C" __global__ void layer_norm(float* x, const float* gamma, const float* beta,
                                      int cols, float eps) {
    extern __shared__ double red[];
    float* row = x + (long long)blockIdx.x * cols;
    double s = 0.0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += (double)row[j];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    double mean = red[0] / cols;
    __syncthreads();
    double q = 0.0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        double c = (double)row[j] - mean;
        q += c * c;
    }
    red[threadIdx.x] = q;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    double inv = 1.0 / sqrt(red[0] / cols + (double)eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = (float)(((double)row[j] - mean) * inv);
        if (gamma) v = v * gamma[j] + beta[j];
        row[j] = v;
    }
}

// One block per row of `cols`; in place. Shared memory: blockDim.x floats.
extern "C" __global__ void softmax_rows(float* x, int cols) {
    extern __shared__ float fred[];
    float* row = x + (long long)blockIdx.x * cols;
    float m = __int_as_float(0xff800000);  // -inf; NVRTC has no INFINITY
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    fred[threadIdx.x] = m;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) fred[threadIdx.x] = fmaxf(fred[threadIdx.x], fred[threadIdx.x + k]);
        __syncthreads();
    }
    m = fred[0];
    __syncthreads();
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float e = expf(row[j] - m);
        row[j] = e;
        s += e;
    }
    fred[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) fred[threadIdx.x] += fred[threadIdx.x + k];
        __syncthreads();
    }
    float inv = 1.0f / fred[0];
    for (int j = threadIdx.x; j < cols; j += blockDim.x) row[j] *= inv;
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
