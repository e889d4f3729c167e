//! `KERNELS` compiled by g++ as C++20 coroutines (one per GPU thread), loaded and launched.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use super::err;
use crate::backend::gpu::{Launch, KERNELS};
use crate::error::Result;

/// Everything the kernels may use, as NVRTC offers it without headers.
const PRELUDE: &str = r#"
#include <coroutine>
struct emu_dim3 { unsigned x, y, z; };
// Per OS thread: tests launch kernels from several threads at once.
static thread_local emu_dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
static thread_local void* emu_shared;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
extern "C" {
float expf(float) noexcept;
float fmaxf(float, float) noexcept;
float fminf(float, float) noexcept;
float sqrtf(float) noexcept;
float fabsf(float) noexcept;
double sqrt(double) noexcept;
double exp(double) noexcept;
double log(double) noexcept;
void sincos(double, double*, double*) noexcept;
}
static inline float __int_as_float(int i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; __builtin_memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
#define __device__ static inline
#define __trap() __builtin_trap()
struct uint4 { unsigned x, y, z, w; };
struct emu_task {
    struct promise_type {
        emu_task get_return_object() {
            return emu_task{std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() noexcept { return {}; }
        std::suspend_always final_suspend() noexcept { return {}; }
        void return_void() {}
        void unhandled_exception() { __builtin_trap(); }
    };
    std::coroutine_handle<promise_type> h;
};
struct emu_sync {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    void await_resume() const noexcept {}
};
struct emu_start {
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    void await_resume() const noexcept {}
};
// Warp shuffles (__shfl_xor_sync): every thread of the block stops at each,
// as at a barrier (kernels shuffle in code every thread runs), leaving its
// value in a slot; resumed, it reads its partner's. Slots alternate with
// the thread's count of shuffles, so a thread that runs on to its next
// shuffle never overwrites a value a slower thread has yet to read.
static thread_local double emu_shfl_slot[2][1024];
static thread_local unsigned emu_shfl_count[1024];
static thread_local int emu_shfl_outside;
template <class T> struct emu_shfl {
    T v;
    unsigned lane_mask;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const noexcept {
        unsigned t = emu_threadIdx.x;
        emu_shfl_slot[emu_shfl_count[t] & 1][t] = (double)v;
    }
    T await_resume() const noexcept {
        unsigned t = emu_threadIdx.x;
        unsigned partner = t ^ lane_mask;
        emu_shfl_count[t] += 1;
        if (lane_mask > 31 || partner >= emu_blockDim.x) {
            emu_shfl_outside = 1;
            return v;
        }
        return (T)emu_shfl_slot[(emu_shfl_count[t] - 1) & 1][partner];
    }
};
#define __shfl_xor_sync(mask, v, lane_mask) (co_await emu_shfl<decltype(v)>{(v), (unsigned)(lane_mask)})
// The tensor cores' mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// (EMU_MMA_BF16(d, a, b): d += A B, A 16 x 16 and B 16 x 8 in bf16, d
// 16 x 8 in f32), a warp's collective: like a shuffle, every thread of the
// block stops at each, leaving its fragments (four 32-bit words of A, two
// of B) in a slot; resumed, it rebuilds A and B from its warp's 32 slots by
// PTX's fragment layouts and computes its own four values of D (products
// exact in f32, summed in k order: a GPU's order and rounding inside the
// sum may differ).
#define EMU_GPU 1
static thread_local unsigned emu_mma_a[2][1024][4];
static thread_local unsigned emu_mma_b[2][1024][2];
static thread_local unsigned emu_mma_count[1024];
struct emu_mma {
    float* d;
    const unsigned* a;
    const unsigned* b;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const noexcept {
        unsigned t = emu_threadIdx.x, s = emu_mma_count[t] & 1;
        for (int i = 0; i < 4; ++i) emu_mma_a[s][t][i] = a[i];
        emu_mma_b[s][t][0] = b[0];
        emu_mma_b[s][t][1] = b[1];
    }
    void await_resume() const noexcept {
        unsigned t = emu_threadIdx.x, s = emu_mma_count[t] & 1;
        emu_mma_count[t] += 1;
        unsigned w = t & ~31u, lane = t & 31u, g = lane >> 2, q = lane & 3u;
        if (w + 32 > emu_blockDim.x) {
            emu_shfl_outside = 1;
            return;
        }
        for (unsigned i = 0; i < 4; ++i) {
            unsigned row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
            float acc = 0.0f;
            for (unsigned k = 0; k < 16; ++k) {
                unsigned aw = emu_mma_a[s][w + (row & 7) * 4 + ((k & 7) >> 1)][(row >> 3) + 2 * (k >> 3)];
                unsigned bw = emu_mma_b[s][w + col * 4 + ((k & 7) >> 1)][k >> 3];
                unsigned ah = (k & 1) ? (aw >> 16) : (aw & 0xffffu);
                unsigned bh = (k & 1) ? (bw >> 16) : (bw & 0xffffu);
                acc += __uint_as_float(ah << 16) * __uint_as_float(bh << 16);
            }
            d[i] += acc;
        }
    }
};
#define EMU_MMA_BF16(d, a, b) (co_await emu_mma{(d), (a), (b)})
// ---- kernels ----
"#;

/// The launcher, after the kernels.
const LAUNCHER: &str = r#"
// ---- launcher ----
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

// 'c': pointer to const float (the kernel only reads), 'p': float pointer
// it may write; 'b' and 'q' the same for unsigned short (bf16).
template <class T> constexpr char emu_tag() {
    if constexpr (std::is_pointer_v<T>) {
        using E = std::remove_pointer_t<T>;
        constexpr bool ro = std::is_const_v<E>;
        if constexpr (std::is_same_v<std::remove_cv_t<E>, unsigned short>) return ro ? 'b' : 'q';
        else return ro ? 'c' : 'p';
    }
    else if constexpr (std::is_same_v<T, int>) return 'i';
    else if constexpr (std::is_same_v<T, float>) return 'f';
    else return '?';
}

template <class... A, std::size_t... I>
static emu_task emu_invoke(emu_task (*f)(A...), void** args, std::index_sequence<I...>) {
    return f(*static_cast<A*>(args[I])...);
}

// Bytes after a block's shared memory that must stay untouched; the
// allocation has room for the 48 KiB maximum beyond them, so a kernel that
// overruns is reported rather than crashing the test.
static const unsigned EMU_SHARED_CANARY = 4096;

// Between barriers a block's threads resume in a fresh random order each
// time, so a kernel whose result depends on that order (a missing
// __syncthreads) gives different results from run to run.
static thread_local unsigned long long emu_rng = 0x9e3779b97f4a7c15ull;
static unsigned emu_below(unsigned n) {
    emu_rng ^= emu_rng << 13;
    emu_rng ^= emu_rng >> 7;
    emu_rng ^= emu_rng << 17;
    return (unsigned)(emu_rng % n);
}

template <class... A>
static int emu_run(const char* name, emu_task (*f)(A...), unsigned grid, unsigned block,
                   unsigned shared, void** args, const char* tags, int nargs, char* err,
                   std::size_t errlen) {
    constexpr int n = sizeof...(A);
    const char want[n + 1] = {emu_tag<A>()..., 0};
    // Given 'n' (null) fits any pointer, a writable buffer fits a const
    // pointer; a read-only buffer never fits a pointer the kernel may write.
    bool fits = nargs == n;
    for (int i = 0; fits && i < n; ++i) {
        char w = want[i], g = tags[i];
        fits = w == g || (g == 'n' && (w == 'c' || w == 'p' || w == 'b' || w == 'q'))
            || (g == 'p' && w == 'c') || (g == 'q' && w == 'b');
    }
    if (!fits) {
        std::snprintf(err, errlen, "%s takes (%s), was given (%.*s)", name, want, nargs, tags);
        return 1;
    }
    if (block == 0 || block > 1024 || grid == 0 || grid > 2147483647u) {
        std::snprintf(err, errlen, "%s: %u blocks of %u threads (CUDA: 1..=1024 threads)",
                      name, grid, block);
        return 1;
    }
    if (shared > 48 * 1024) {
        std::snprintf(err, errlen, "%s: %u bytes of dynamic shared memory (48 KiB without opt-in)",
                      name, shared);
        return 1;
    }
    std::vector<unsigned char> sh(48 * 1024 + EMU_SHARED_CANARY + shared);
    std::memset(sh.data() + shared, 0xa5, EMU_SHARED_CANARY);
    std::vector<std::coroutine_handle<emu_task::promise_type>> th(block);
    std::vector<char> done(block);
    std::vector<unsigned> order(block);
    for (unsigned t = 0; t < block; ++t) order[t] = t;
    emu_blockDim = {block, 1, 1};
    emu_gridDim = {grid, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
        emu_blockIdx = {b, 0, 0};
        std::memset(sh.data(), 0xff, shared);  // NaN, like uninitialised shared memory
        emu_shared = sh.data();
        std::memset(emu_shfl_count, 0, sizeof emu_shfl_count);
        std::memset(emu_mma_count, 0, sizeof emu_mma_count);
        emu_shfl_outside = 0;
        for (unsigned t = 0; t < block; ++t) {
            emu_threadIdx = {t, 0, 0};
            th[t] = emu_invoke(f, args, std::index_sequence_for<A...>{}).h;
            done[t] = 0;
        }
        unsigned left = block;
        int diverged = 0;
        while (left > 0) {
            unsigned finished = 0, waiting = 0;
            for (unsigned i = block - 1; i > 0; --i) std::swap(order[i], order[emu_below(i + 1)]);
            for (unsigned oi = 0; oi < block; ++oi) {
                unsigned t = order[oi];
                if (done[t]) continue;
                emu_threadIdx = {t, 0, 0};
                th[t].resume();
                if (th[t].done()) { done[t] = 1; --left; ++finished; } else { ++waiting; }
            }
            if (finished > 0 && waiting > 0) { diverged = 1; break; }
        }
        for (unsigned t = 0; t < block; ++t) th[t].destroy();
        if (emu_shfl_outside) {
            std::snprintf(err, errlen, "%s, block %u: a shuffle's partner lane is outside the warp or the block, or an mma's warp is not all in the block", name, b);
            return 1;
        }
        if (diverged) {
            std::snprintf(err, errlen, "%s, block %u: some threads exited while others wait at __syncthreads()", name, b);
            return 1;
        }
        for (unsigned i = 0; i < EMU_SHARED_CANARY; ++i) {
            if (sh[shared + i] != 0xa5) {
                std::snprintf(err, errlen, "%s, block %u: wrote past its %u bytes of shared memory", name, b, shared);
                return 1;
            }
        }
    }
    return 0;
}
"#;

/// `KERNELS` as C++20: each `extern "C" __global__ void` kernel becomes a
/// coroutine returning `emu_task` (so `__syncthreads()` can suspend it),
/// `return;` becomes `co_return;`, and `extern __shared__ T name[];` points
/// at the block's shared memory. Returns the source and the kernel names.
fn kernels_as_cpp(src: &str) -> std::result::Result<(String, Vec<String>), String> {
    const GLOBAL: &str = "extern \"C\" __global__ void ";
    let mut out = String::new();
    let mut names = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find(GLOBAL) {
        out.push_str(&rest[..i]);
        rest = &rest[i + GLOBAL.len()..];
        let paren = rest.find('(').ok_or("a kernel without a parameter list")?;
        names.push(rest[..paren].trim().to_string());
        let body = rest.find('{').ok_or("a kernel without a body")?;
        out.push_str("emu_task ");
        out.push_str(&rest[..=body]);
        out.push_str(" co_await emu_start{};");
        rest = &rest[body + 1..];
    }
    out.push_str(rest);
    let mut out = out
        .replace("__syncthreads();", "co_await emu_sync{};")
        .replace("return;", "co_return;");
    const SHARED: &str = "extern __shared__ ";
    while let Some(i) = out.find(SHARED) {
        let end = i + out[i..]
            .find(';')
            .ok_or("unterminated __shared__ declaration")?;
        let decl = out[i + SHARED.len()..end].trim();
        let (ty, name) = decl
            .strip_suffix("[]")
            .and_then(|d| d.rsplit_once(' '))
            .ok_or_else(|| format!("unsupported shared declaration `{decl}`"))?;
        let repl = format!("{ty}* {name} = static_cast<{ty}*>(emu_shared)");
        out.replace_range(i..end, &repl);
    }
    Ok((out, names))
}

type LaunchFn = unsafe extern "C" fn(
    *const c_char,
    u32,
    u32,
    u32,
    *mut *mut c_void,
    *const c_char,
    c_int,
    *mut c_char,
    usize,
) -> c_int;

/// The kernels, compiled and loaded.
pub(super) struct Kernels {
    _lib: libloading::Library,
    launch: LaunchFn,
}

impl Kernels {
    /// Run kernel `name` over `launch` with the arguments `slots` point at,
    /// tagged in `tags` ('c' read-only and 'p' writable pointer, 'n' null,
    /// 'i' int, 'f' float); the launcher's refusal comes back as the error.
    ///
    /// # Safety
    /// Each slot points at a live value of its tag's type, and each pointer
    /// there at memory the kernel may use as the launch sizes it.
    pub(super) unsafe fn call(
        &self,
        name: &CStr,
        launch: Launch,
        slots: &mut [*mut c_void],
        tags: &CStr,
    ) -> Result<()> {
        let mut msg = vec![0 as c_char; 512];
        // SAFETY: as the caller promises; the launcher checks the tags
        // against the kernel's signature before it reads the slots.
        let rc = unsafe {
            (self.launch)(
                name.as_ptr(),
                launch.grid,
                launch.block,
                launch.shared_bytes,
                slots.as_mut_ptr(),
                tags.as_ptr(),
                slots.len() as c_int,
                msg.as_mut_ptr(),
                msg.len(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: snprintf wrote a NUL-terminated message into msg.
        let m = unsafe { CStr::from_ptr(msg.as_ptr()) };
        Err(err(m.to_string_lossy().into_owned()))
    }
}

/// Compile `src` (kernel source in the NVRTC dialect) into a loaded library.
fn compile(src: &str) -> std::result::Result<Kernels, String> {
    let (cpp, names) = kernels_as_cpp(src)?;
    let mut file = String::from(PRELUDE);
    file.push_str(&cpp);
    file.push_str(LAUNCHER);
    file.push_str(
        "extern \"C\" int emu_launch(const char* name, unsigned grid, unsigned block,\n\
         unsigned shared, void** args, const char* tags, int nargs, char* err,\n\
         std::size_t errlen) {\n",
    );
    for n in &names {
        file.push_str(&format!(
            "    if (!std::strcmp(name, \"{n}\")) return emu_run(name, {n}, grid, block, shared, args, tags, nargs, err, errlen);\n"
        ));
    }
    file.push_str(
        "    std::snprintf(err, errlen, \"no kernel named %s\", name);\n    return 1;\n}\n",
    );
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "tessera-gpu-emulator-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (cpp_path, lib_path) = (dir.join("kernels.cpp"), dir.join("libkernels.so"));
    std::fs::write(&cpp_path, &file).map_err(|e| e.to_string())?;
    let out = Command::new("g++")
        .args(["-std=c++20", "-O2", "-fPIC", "-shared", "-o"])
        .arg(&lib_path)
        .arg(&cpp_path)
        .output()
        .map_err(|e| format!("running g++ (install build-essential): {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(format!(
            "the kernels do not compile:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // SAFETY: our own library, built just now; emu_launch has LaunchFn's
    // signature (see the generated source above).
    let kernels = unsafe {
        let lib = libloading::Library::new(&lib_path).map_err(|e| e.to_string())?;
        let launch = *lib
            .get::<LaunchFn>(b"emu_launch\0")
            .map_err(|e| e.to_string())?;
        Kernels { _lib: lib, launch }
    };
    let _ = std::fs::remove_dir_all(&dir);
    Ok(kernels)
}

pub(super) fn kernels() -> &'static Kernels {
    static K: OnceLock<Kernels> = OnceLock::new();
    K.get_or_init(|| compile(KERNELS).unwrap_or_else(|e| panic!("GPU emulator: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::Kernel;

    #[test]
    fn shuffles_exchange_within_the_warp_and_a_partner_outside_is_reported() {
        let src = r#"
extern "C" __global__ void warp_sum(float* x) {
    float v = x[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    x[threadIdx.x] = v;
}
extern "C" __global__ void outside(float* x) {
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 32);
}
"#;
        let k = compile(src).unwrap();
        let mut x: Vec<f32> = (0..64).map(|i| i as f32).collect();
        launch_raw(&k, c"warp_sum", &mut x, 64, 0).unwrap();
        // Each warp's lanes all hold their warp's sum, not the block's.
        let (w0, w1): (f32, f32) = (
            (0..32).map(|i| i as f32).sum(),
            (32..64).map(|i| i as f32).sum(),
        );
        assert!(x[..32].iter().all(|&v| v == w0), "{x:?}");
        assert!(x[32..].iter().all(|&v| v == w1), "{x:?}");
        let mut x = vec![0f32; 64];
        let e = launch_raw(&k, c"outside", &mut x, 64, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the warp"), "{e}");
    }

    #[test]
    fn the_kernel_list_matches_the_source() {
        let (_, names) = kernels_as_cpp(KERNELS).unwrap();
        let listed: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, listed);
    }

    #[test]
    fn kernels_that_nvrtc_would_refuse_do_not_build() {
        // NVRTC has no <math.h>: INFINITY is unknown there, and here.
        let src = KERNELS.replacen("__int_as_float(0xff800000)", "-INFINITY", 1);
        assert_ne!(src, KERNELS);
        let e = compile(&src).err().expect("INFINITY must not compile");
        assert!(e.contains("INFINITY"), "{e}");
    }

    /// One launch of a single-pointer kernel over one block of `block` threads.
    fn launch_raw(k: &Kernels, name: &CStr, x: &mut [f32], block: u32, shared: u32) -> Result<()> {
        let mut p = x.as_mut_ptr();
        let mut slots = [(&mut p) as *mut *mut f32 as *mut c_void];
        let launch = Launch {
            grid: 1,
            block,
            shared_bytes: shared,
        };
        // SAFETY: one writable pointer argument to `x`, which the test
        // kernels index below `block`.
        unsafe { k.call(name, launch, &mut slots, c"p") }
    }

    #[test]
    fn a_missing_barrier_shows_as_results_that_change_between_runs() {
        let src = r#"
extern "C" __global__ void racy(float* x) {
    extern __shared__ float s[];
    s[threadIdx.x] = (float)threadIdx.x;
    // A __syncthreads() belongs here.
    x[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
extern "C" __global__ void fixed(float* x) {
    extern __shared__ float s[];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    x[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
"#;
        let k = compile(src).unwrap();
        let run = |name: &CStr| {
            let mut x = vec![0f32; 64];
            launch_raw(&k, name, &mut x, 64, 64 * 4).unwrap();
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let racy: Vec<_> = (0..4).map(|_| run(c"racy")).collect();
        assert!(
            racy.windows(2).any(|w| w[0] != w[1]),
            "the race went unseen"
        );
        let fixed: Vec<_> = (0..4).map(|_| run(c"fixed")).collect();
        assert!(fixed.windows(2).all(|w| w[0] == w[1]));
        let want: Vec<u32> = (0..64).map(|t| (((t + 1) % 64) as f32).to_bits()).collect();
        assert_eq!(fixed[0], want);
    }

    #[test]
    fn barrier_divergence_is_reported() {
        let src = r#"
extern "C" __global__ void diverge(float* x) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}
"#;
        let k = compile(src).unwrap();
        let mut x = vec![0f32; 4];
        let e = launch_raw(&k, c"diverge", &mut x, 4, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("others wait at __syncthreads"), "{e}");
    }
}
