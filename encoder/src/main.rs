//! `tessera-encode`: encode tiles, benchmark and tune backends, make synthetic inputs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand};
use tessera_encoder::{
    bench, random_checkpoint, tile, write_safetensors, BackendChoice, Checkpoint, DeviceProfile,
    Dtype, EncodeError, Encoder, ModelConfig, OutputOptions, OutputWriter, ProfileSet, SynthTile,
    TileInputs, TileReader,
};

#[derive(Parser)]
#[command(name = "tessera-encode", version, about = "TESSERA v2 pixel encoder")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    encode: EncodeArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Pixels/s, GFLOP/s and fraction of this machine's GEMM rate, per backend and thread count.
    Bench(BenchArgs),
    /// Sweep chunk and block sizes and store the fastest in the device profile.
    Tune(TuneArgs),
    /// The host side of encoding a tile (read, count, gather, assemble; no
    /// model compute), against reading its files: whether the host keeps up
    /// with a device.
    HostRate(HostRateArgs),
    /// Write a random-weight checkpoint (.safetensors) of the given sizes.
    SynthCkpt(SynthCkptArgs),
    /// Write a random tile in the geotessera layout.
    SynthTile(SynthTileArgs),
    /// Which backends this build has, which this machine can run (and why
    /// not), and what `--backend auto` picks.
    Backends,
    /// Check a checkpoint's headers without reading its tensors: format,
    /// config, each tensor's dtype and shape against the bytes present and
    /// the model's expectations. Exits 1 naming the problem.
    Inspect(InspectArgs),
}

#[derive(Args)]
struct InspectArgs {
    /// Checkpoint (.pt or .safetensors).
    #[arg(long)]
    ckpt: PathBuf,
    /// Print every tensor's dtype and shape too.
    #[arg(long)]
    tensors: bool,
}

/// Backend and device settings of an encoding run.
#[derive(Args, Clone)]
struct RunArgs {
    /// The backend (auto: cuda, then onednn, then cpu, whichever runs here).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
    /// Threads (default: the profile's, else all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    profile: ProfileArgs,
}

impl RunArgs {
    fn resolve(&self) -> Result<(BackendChoice, DeviceProfile)> {
        let choice = self.backend.resolve();
        Ok((choice, self.profile.resolve(choice, self.threads)?))
    }
}

/// The device profile and what overrides it; shared by encoding and `bench`.
#[derive(Args, Clone)]
struct ProfileArgs {
    /// Pixels per GEMM chunk (default: the profile's).
    #[arg(long)]
    batch_pixels: Option<usize>,
    /// Pixels per thread block (default: the profile's).
    #[arg(long)]
    block_pixels: Option<usize>,
    /// Device profile TOML file.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Compute precision (default: the profile's, else f32): f32; bf16
    /// (onednn, where the CPU has AMX or AVX-512 bf16); tf32 (cuda: TF32
    /// tensor cores, faster and less exact).
    #[arg(long, value_enum)]
    dtype: Option<Dtype>,
}

impl ProfileArgs {
    /// The profile for `choice` (a concrete backend) with these overrides
    /// and `threads`.
    fn resolve(&self, choice: BackendChoice, threads: Option<usize>) -> Result<DeviceProfile> {
        let mut p = DeviceProfile::resolve(self.profile.as_deref(), choice)?;
        if let Some(t) = threads {
            p.threads = t.max(1);
        }
        if let Some(b) = self.batch_pixels {
            p.chunk_pixels = b.max(1);
        }
        if let Some(b) = self.block_pixels {
            p.block_pixels = b.max(1);
        }
        if let Some(d) = self.dtype {
            p.dtype = d;
        }
        Ok(p)
    }
}

#[derive(Args)]
struct EncodeArgs {
    /// Checkpoint (.pt or .safetensors).
    #[arg(long)]
    ckpt: Option<PathBuf>,
    /// One tile directory (bands.npy, masks.npy, ...).
    #[arg(long, conflicts_with = "data_root")]
    tile: Option<PathBuf>,
    /// Encode every tile directory under this root.
    #[arg(long)]
    data_root: Option<PathBuf>,
    /// Where NAME.npy (and NAME_scales.npy) go; NAME = the tile directory's name.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Write int8 codes plus per-pixel scales instead of f32.
    #[arg(long)]
    int8: bool,
    /// Keep only the first N channels (Matryoshka truncation, no renormalisation).
    #[arg(long, default_value_t = 128, value_parser = clap::builder::PossibleValuesParser::new(["16", "32", "64", "128"]).map(|s| s.parse::<usize>().expect("listed values are numbers")))]
    dim: usize,
    /// Pixels with data encoded per window: the inputs held at once are a
    /// few windows (each pixels x 21 bytes per S2 frame and 4 per S1 frame),
    /// never the whole tile.
    #[arg(long, default_value_t = tessera_encoder::encode::WINDOW_PIXELS)]
    window_pixels: usize,
    #[command(flatten)]
    run: RunArgs,
}

/// Sizes of the random checkpoint `bench` and `tune` use without `--ckpt`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Size {
    /// The published Large student.
    Large,
    /// The fixtures' small model.
    Small,
}

impl Size {
    fn config(self) -> ModelConfig {
        match self {
            Size::Large => ModelConfig::large(),
            Size::Small => ModelConfig::small(),
        }
    }
}

/// The checkpoint and tile `bench` and `tune` time.
#[derive(Args)]
struct BenchInputs {
    /// Checkpoint; default: random weights of `--size`.
    #[arg(long)]
    ckpt: Option<PathBuf>,
    /// Sizes of the random checkpoint: large (published) or small (fixtures).
    #[arg(long, value_enum, default_value_t = Size::Large)]
    size: Size,
    /// Real tile to time; default: a synthetic tile with `--obs` valid observations per modality.
    #[arg(long)]
    tile: Option<PathBuf>,
    #[arg(long, default_value_t = 64)]
    obs: usize,
}

impl BenchInputs {
    /// The checkpoint, and the tile (a synthetic one of `pixels` if none was given).
    fn load(&self, pixels: usize) -> Result<(Checkpoint, TileInputs)> {
        let ck = match &self.ckpt {
            Some(p) => Checkpoint::load(p)?,
            None => random_checkpoint(&self.size.config(), 1),
        };
        let obs = self.obs;
        let t = match &self.tile {
            Some(p) => TileInputs::read(p)?,
            None => TileInputs::synthetic(&SynthTile {
                height: 1,
                width: pixels.max(1),
                s2_frames: obs,
                s1_asc_frames: obs / 2,
                s1_desc_frames: obs - obs / 2,
                clear: 1.0,
                seed: 2,
            }),
        };
        Ok((ck, t))
    }
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    inputs: BenchInputs,
    #[arg(long, default_value_t = 16)]
    pixels: usize,
    /// Backends to compare (default: every backend this build has).
    #[arg(long, value_enum, value_delimiter = ',')]
    backends: Vec<BackendChoice>,
    /// Thread counts to try.
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    #[arg(long, default_value_t = 1)]
    reps: usize,
    // Every backend timed takes these (`--dtype`: default each profile's).
    #[command(flatten)]
    profile: ProfileArgs,
}

#[derive(Args)]
struct TuneArgs {
    #[command(flatten)]
    inputs: BenchInputs,
    /// Pixels of the synthetic tile (default: 64 on CPUs, 16384 on a GPU).
    #[arg(long)]
    pixels: Option<usize>,
    /// Chunk sizes to try (default: 32 to 512 on CPUs; 64 to 16384 on a
    /// GPU, where the best was 64 on an L4, 1024 on an A30, 4096 on an
    /// H200 in f32 and 1024 there in bf16). Sizes past the tile's pixels
    /// are tried once.
    #[arg(long, value_delimiter = ',')]
    chunks: Vec<usize>,
    /// Block sizes to try (default: 1,2,4,8,16 on CPUs; a GPU has no blocks).
    #[arg(long, value_delimiter = ',')]
    blocks: Vec<usize>,
    /// Profile file to update (the agent's `--encoder-profile`).
    #[arg(
        long = "out",
        alias = "profile",
        default_value = "tessera-profiles.toml"
    )]
    out: PathBuf,
    /// The backend to tune (default: what `--backend auto`, and so the
    /// agent, runs here).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
    /// Thread counts to try (default: the profile's; on a CPU backend
    /// where a core runs two threads, the physical cores' count too, as
    /// two threads on a core share its AMX unit).
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Precision to tune and store (default: the stored profile's, else f32).
    #[arg(long, value_enum)]
    dtype: Option<Dtype>,
}

#[derive(Args)]
struct HostRateArgs {
    /// Tile directory (bands.npy, masks.npy, ...).
    #[arg(long)]
    tile: PathBuf,
    /// Model sizes (the shapes handed over; nothing is computed).
    #[arg(long, value_enum, default_value_t = Size::Large)]
    size: Size,
    /// Pixels per chunk, as a profile's `chunk_pixels`.
    #[arg(long, default_value_t = 4096)]
    batch_pixels: usize,
    #[arg(long, default_value_t = tessera_encoder::encode::WINDOW_PIXELS)]
    window_pixels: usize,
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Also run against a simulated device of this many pixels/s (each
    /// chunk sleeps as long as it would keep that device busy): how much
    /// of such a device's rate the host side leaves.
    #[arg(long)]
    device_rate: Option<f64>,
    /// Also write the output there (all 128 channels; f32, or int8 with
    /// `--int8`) as `encode` does, beside the encode, and time against it
    /// the peer that encodes into memory and writes after.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// With `--out-dir`: int8 codes and scales instead of f32.
    #[arg(long, requires = "out_dir")]
    int8: bool,
}

#[derive(Args)]
struct SynthCkptArgs {
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 160)]
    latent_dim: usize,
    #[arg(long, default_value_t = 4)]
    num_layers: usize,
    #[arg(long, default_value_t = 4)]
    nhead: usize,
    #[arg(long, default_value_t = 2560)]
    dim_feedforward: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct SynthTileArgs {
    /// Tile directory to create.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 32)]
    height: usize,
    #[arg(long, default_value_t = 32)]
    width: usize,
    #[arg(long, default_value_t = 64)]
    s2_frames: usize,
    #[arg(long, default_value_t = 32)]
    s1_asc_frames: usize,
    #[arg(long, default_value_t = 32)]
    s1_desc_frames: usize,
    /// Probability that a frame is a valid observation.
    #[arg(long, default_value_t = 0.7)]
    clear: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        None => run_encode(cli.encode),
        Some(Cmd::Bench(a)) => run_bench(a),
        Some(Cmd::Tune(a)) => run_tune(a),
        Some(Cmd::HostRate(a)) => run_host_rate(a),
        Some(Cmd::SynthCkpt(a)) => run_synth_ckpt(a),
        Some(Cmd::SynthTile(a)) => run_synth_tile(a),
        Some(Cmd::Backends) => {
            run_backends();
            Ok(())
        }
        Some(Cmd::Inspect(a)) => run_inspect(a),
    };
    if let Err(e) = result {
        let cancelled = matches!(
            e.downcast_ref::<EncodeError>(),
            Some(EncodeError::Cancelled)
        );
        eprintln!("error: {e:#}");
        std::process::exit(if cancelled { 130 } else { 1 });
    }
}

fn run_inspect(a: InspectArgs) -> Result<()> {
    let info = tessera_encoder::checkpoint::validate(&a.ckpt)?;
    println!(
        "{}: {:?}, {} tensors, {} elements, {} bytes",
        a.ckpt.display(),
        info.format,
        info.tensors.len(),
        info.elements(),
        info.file_bytes
    );
    println!("config: {}", info.config.to_json());
    if a.tensors {
        for (name, t) in &info.tensors {
            println!("{name}\t{:?}\t{:?}", t.dtype, t.shape);
        }
    }
    Ok(())
}

fn run_backends() {
    for b in BackendChoice::CONCRETE {
        match tessera_encoder::backend::unavailable_reason(b) {
            None => println!(
                "{:<10} usable  device: {}",
                b.name(),
                tessera_encoder::backend::device_name(b)
            ),
            Some(why) => println!("{:<10} not usable: {why}", b.name()),
        }
    }
    let auto = BackendChoice::Auto.resolve();
    println!(
        "auto ->    {} ({}; `tune` measures this one)",
        auto.name(),
        tessera_encoder::backend::isa(auto)
    );
    #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
    if tessera_encoder::backend::unavailable_reason(BackendChoice::Cuda).is_none() {
        println!(
            "cuda:      {}",
            tessera_encoder::backend::cuda::fused_epilogue_report()
        );
        if let Some(kernels) = tessera_encoder::backend::cuda::kernels_report() {
            println!("cuda:      {kernels}");
        }
    }
    #[cfg(all(feature = "onednn", target_os = "linux"))]
    println!(
        "onednn:    {}",
        match onednn::v3::unavailable_reason() {
            None => tessera_encoder::backend::isa(BackendChoice::Onednn),
            Some(why) => format!(
                "{} (the linked one; no oneDNN 3.x: {why})",
                tessera_encoder::backend::isa(BackendChoice::Onednn)
            ),
        }
    );
}

fn run_encode(a: EncodeArgs) -> Result<()> {
    let ckpt = a.ckpt.context("--ckpt is required")?;
    let out_dir = a.out_dir.context("--out-dir is required")?;
    let tiles = match (&a.tile, &a.data_root) {
        (Some(t), None) => vec![t.clone()],
        (None, Some(root)) => {
            let found = tile::find_tiles(root)?;
            if found.is_empty() {
                bail!(
                    "no tile directory (with bands.npy) under {}",
                    root.display()
                );
            }
            found
        }
        _ => bail!("give --tile DIR or --data-root DIR"),
    };
    let started = std::time::Instant::now();
    let (choice, profile) = a.run.resolve()?;
    if let Some(note) = tessera_encoder::backend::precision_note(choice, profile.dtype) {
        eprintln!("warning: {note}");
    }
    let resolved = started.elapsed().as_secs_f64();
    let mut enc = Encoder::load(&ckpt, choice, profile)?;
    // Start-up by part: what a whole process's figure has beyond its
    // tiles' (the first tile also pays a GPU's GEMM timing).
    if let Some(t) = enc.load_times() {
        eprintln!(
            "ready in {:.3} s: backend chosen in {resolved:.3} s, checkpoint read in {:.3} s, \
             {} backend built in {:.3} s",
            started.elapsed().as_secs_f64(),
            t.checkpoint.as_secs_f64(),
            enc.backend_name(),
            t.backend.as_secs_f64()
        );
    }
    enc.set_window_pixels(a.window_pixels);
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let cancel = cancel.clone();
        ctrlc::set_handler(move || cancel.store(true, Ordering::Relaxed))
            .context("installing the Ctrl-C handler")?;
    }
    for dir in &tiles {
        let name = tile_name(dir)?;
        let started = std::time::Instant::now();
        let inputs = TileReader::open(dir)?;
        eprintln!(
            "encoding {name}: {}x{} px, {} S2 + {} S1 frames ({:.1} MB), {} backend",
            inputs.height(),
            inputs.width(),
            inputs.s2_frames(),
            inputs.s1_frames(),
            inputs.data_bytes() as f64 / 1e6,
            enc.backend_name()
        );
        let bar = indicatif::ProgressBar::new(inputs.pixels() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} px ({per_sec}, eta {eta})",
            )
            .expect("the template is valid"),
        );
        bar.set_message(name.clone());
        // Written as the windows are encoded; into place once all are.
        let mut out = OutputWriter::create(
            &out_dir,
            &name,
            OutputOptions {
                int8: a.int8,
                dim: a.dim,
            },
            (inputs.height(), inputs.width()),
            enc.config().repr_dim,
        )?;
        let encoded = enc.encode_into(
            &inputs,
            &mut out,
            &|done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            },
            &cancel,
        );
        bar.finish_and_clear();
        encoded.with_context(|| format!("encoding {}", dir.display()))?;
        let encoded = started.elapsed().as_secs_f64();
        let files = out.finish()?;
        for f in files {
            eprintln!("wrote {}", f.display());
        }
        // The tile alone, as a running encoder sees it (the first tile of a
        // process also pays for the device's warm-up).
        let took = started.elapsed().as_secs_f64();
        eprintln!(
            "tile {name}: {} px in {took:.3} s, {:.0} px/s (read, encoded, written)",
            inputs.pixels(),
            inputs.pixels() as f64 / took.max(1e-9)
        );
        // Where a fast device's tile time goes besides the encode itself
        // (its own line: scripts parse the one above). The output is
        // written beside the encode, every window of it by the encode's
        // end; what is left is the scales, the last syncs and the renames.
        eprintln!(
            "  (opened and encoded in {encoded:.3} s, output finished in {:.3} s)",
            took - encoded
        );
    }
    if let Some(kib) = bench::peak_resident_kib() {
        eprintln!("peak resident memory: {} MiB", kib / 1024);
    }
    // The chunk buffers are kept until the encoder goes, so this is the
    // encode's high-water mark on the device.
    #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
    if enc.backend_name() == "cuda" {
        if let Some((used, total)) = tessera_encoder::backend::cuda::memory_in_use_mib() {
            eprintln!(
                "GPU memory in use after the encode: {used} MiB of {total} (the whole device)"
            );
        }
        if let Some(kernels) = tessera_encoder::backend::cuda::kernels_report() {
            eprintln!("{kernels}");
        }
        for line in tessera_encoder::backend::cuda::gemm_tuning_report() {
            eprintln!("{line}");
        }
    }
    Ok(())
}

fn tile_name(dir: &Path) -> Result<String> {
    let canon = dir
        .canonicalize()
        .with_context(|| format!("tile directory {}", dir.display()))?;
    canon
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .with_context(|| format!("tile directory {} has no usable name", dir.display()))
}

fn run_bench(a: BenchArgs) -> Result<()> {
    let (ck, tile) = a.inputs.load(a.pixels)?;
    let cfg = ck.config;
    let threads = if a.threads.is_empty() {
        vec![1, tessera_encoder::profile::available_threads()]
    } else {
        a.threads.clone()
    };
    println!(
        "model: latent {} (d {}), {} layers, {} heads, FFN {}: {} params; tile {} px, {:.2} GFLOP",
        cfg.latent_dim,
        cfg.d_model(),
        cfg.num_layers,
        cfg.nhead,
        cfg.dim_feedforward,
        cfg.param_count(),
        tile.pixels(),
        bench::tile_flops(&cfg, &tile) / 1e9
    );
    let backends = if a.backends.is_empty() {
        BackendChoice::available()
    } else {
        a.backends.clone()
    };
    // Two peers per thread count: the `gemm` crate's rate on an FFN-shaped
    // GEMM (one per thread), and oneDNN's sgemm (the roofline of
    // BENCHMARKS.md's target) when this build links oneDNN. Both measured here, right before the backends.
    println!(
        "{:<10} {:>7} {:>6} {:>6} {:>10} {:>9} {:>10} {:>8} {:>10} {:>8}",
        "backend",
        "threads",
        "chunk",
        "block",
        "pixels/s",
        "GFLOP/s",
        "gemm GF/s",
        "of gemm",
        "dnnl GF/s",
        "of dnnl"
    );
    println!("load average before: {}", bench::load_average());
    let mut dedup = threads.clone();
    dedup.dedup();
    for t in dedup {
        let peak = bench::gemm_rate(t, 1.0);
        let dnnl = bench::dnnl_sgemm_rate(t)?;
        if let Some(fma) = bench::fma_peak_rate(t, 1.0) {
            let of = |r: f64| format!("{:.0}%", 100.0 * r / fma);
            println!(
                "{t} thread(s): FMA ceiling {fma:.1} GFLOP/s; gemm crate at {}, oneDNN sgemm at {} of it",
                of(peak),
                dnnl.map_or("-".into(), of)
            );
        }
        // bf16 rows: the ceiling they answer to (AVX512-BF16's dot product).
        let bf16_ceiling = (a.profile.dtype == Some(Dtype::Bf16))
            .then(|| bench::bf16_dot_peak_rate(t, 1.0))
            .flatten();
        if let Some(c) = bf16_ceiling {
            println!(
                "{t} thread(s): bf16 dot-product ceiling {c:.1} GFLOP/s (AVX512-BF16 `vdpbf16ps`, no AMX)"
            );
        }
        for b in &backends {
            let choice = b.resolve();
            let profile = a.profile.resolve(choice, Some(t))?;
            let r = bench::bench_encoder(&ck, choice, profile, &tile, a.reps, false)?;
            let (dnnl_rate, of_dnnl) = match dnnl {
                Some(d) => (format!("{d:.1}"), format!("{:.0}%", 100.0 * r.gflops / d)),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<10} {:>7} {:>6} {:>6} {:>10.2} {:>9.1} {:>10.1} {:>7.0}% {:>10} {:>8}",
                r.backend,
                t,
                r.chunk_pixels,
                r.block_pixels,
                r.pixels_per_s,
                r.gflops,
                peak,
                100.0 * r.gflops / peak,
                dnnl_rate,
                of_dnnl
            );
            if let Some(c) = bf16_ceiling {
                println!(
                    "{:<10} {:>7} bf16: {:.0}% of the bf16 dot-product ceiling",
                    "",
                    "",
                    100.0 * r.gflops / c
                );
            }
        }
    }
    println!("load average after: {}", bench::load_average());
    Ok(())
}

fn run_host_rate(a: HostRateArgs) -> Result<()> {
    let mut profile = DeviceProfile::default_for(BackendChoice::Cpu);
    profile.chunk_pixels = a.batch_pixels.max(1);
    let cfg = a.size.config();
    let output = a.out_dir.as_deref().map(|dir| bench::HostRateOutput {
        dir,
        opts: OutputOptions {
            int8: a.int8,
            dim: cfg.repr_dim,
        },
    });
    let run = |rate| {
        bench::host_rate(
            &a.tile,
            &cfg,
            profile.clone(),
            a.window_pixels,
            a.reps,
            rate,
            output.as_ref(),
        )
    };
    let r = run(None)?;
    println!(
        "host side of {} ({} px with data, {:.2} GB of .npy), chunk {}, best of {}; load average {}",
        a.tile.display(),
        r.pixels,
        r.bytes as f64 / 1e9,
        a.batch_pixels,
        a.reps.max(1),
        bench::load_average()
    );
    println!(
        "read the files once: {:.3} s ({:.2} GB/s); encode with no compute: {:.3} s = {:.0} px/s ({:.2}x the read time), {:.1} us of CPU per pixel",
        r.read_s,
        r.bytes as f64 / r.read_s / 1e9,
        r.encode_s,
        r.pixels_per_s(),
        r.encode_s / r.read_s,
        r.cpu_s / r.pixels.max(1) as f64 * 1e6
    );
    println!(
        "first chunk handed over after {:.3} s (counting the first window's observations, reading and gathering it: a device's idle start)",
        r.first_chunk_s
    );
    let print_written = |r: &bench::HostRate, what: &str| {
        if let Some(after) = r.written_after_s {
            println!(
                "{what}, output written as encoded ({}): {:.3} s ({:.3} s of it after the encode); encoded, then written: {after:.3} s ({:.3}x)",
                if a.int8 { "int8" } else { "f32" },
                r.encode_s,
                r.finish_s,
                after / r.encode_s
            );
        }
    };
    print_written(&r, "no compute");
    if let Some(kib) = r.streamed_peak_kib {
        println!(
            "peak resident memory after the first encode (output written as encoded): {} MiB",
            kib / 1024
        );
    }
    if let Some(kib) = bench::peak_resident_kib() {
        println!(
            "peak resident memory: {} MiB (the host's share of an encode on a device: the model's \
             weights, windows, chunks in flight, pooled features{})",
            kib / 1024,
            if output.is_some() {
                "; the peer holds the embedding whole"
            } else {
                ", the embedding"
            }
        );
    }
    if let Some(rate) = a.device_rate {
        let d = run(Some(rate))?;
        println!(
            "with a simulated device of {rate:.0} px/s: {:.3} s = {:.0} px/s, {:.1} % of the device's rate",
            d.encode_s,
            d.pixels_per_s(),
            100.0 * d.pixels_per_s() / rate
        );
        if let Some(after) = d.written_after_s {
            println!(
                "  encoded, then written: {after:.3} s = {:.0} px/s, {:.1} % of the device's rate",
                d.pixels as f64 / after,
                100.0 * d.pixels as f64 / after / rate
            );
        }
        print_written(&d, "simulated device");
    }
    Ok(())
}

fn run_tune(a: TuneArgs) -> Result<()> {
    let choice = a.backend.resolve();
    let gpu = choice == BackendChoice::Cuda;
    let or = |given: &[usize], cpu: &[usize], gpu_default: &[usize]| -> Vec<usize> {
        if !given.is_empty() {
            given.to_vec()
        } else if gpu {
            gpu_default.to_vec()
        } else {
            cpu.to_vec()
        }
    };
    let chunks = or(&a.chunks, bench::CPU_CHUNKS, bench::GPU_CHUNKS);
    let blocks = or(&a.blocks, &[1, 2, 4, 8, 16], &[1]);
    let pixels = a.pixels.unwrap_or(if gpu { 16384 } else { 64 });
    let (ck, tile) = a.inputs.load(pixels)?;
    let chunks = bench::distinct_chunks(&chunks, tile.pixels());
    let mut base = DeviceProfile::resolve(Some(a.out.as_path()), choice)?;
    if let Some(d) = a.dtype {
        base.dtype = d;
    }
    let threads = if !a.threads.is_empty() {
        a.threads.iter().map(|&t| t.max(1)).collect()
    } else if gpu {
        vec![base.threads]
    } else {
        bench::cpu_thread_counts(base.threads, tessera_encoder::profile::physical_cores())
    };
    println!(
        "device: {} ({}, {}, {} threads, {})",
        base.device,
        base.backend,
        tessera_encoder::backend::isa(choice),
        threads
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" or "),
        base.dtype
    );
    if let Some(note) = tessera_encoder::backend::precision_note(choice, base.dtype) {
        println!("warning: {note}");
    }
    println!(
        "{:>7} {:>6} {:>6} {:>10} {:>9}",
        "threads", "chunk", "block", "pixels/s", "GFLOP/s"
    );
    let sweep = bench::TuneSweep {
        threads: &threads,
        chunks: &chunks,
        blocks: &blocks,
    };
    let results = bench::tune(&ck, choice, &base, &tile, &sweep, &mut |r| {
        println!(
            "{:>7} {:>6} {:>6} {:>10.2} {:>9.1}",
            r.threads, r.chunk_pixels, r.block_pixels, r.pixels_per_s, r.gflops
        )
    })?;
    let best = results
        .first()
        .context("no chunk/block combination to try")?;
    let mut set = if a.out.exists() {
        ProfileSet::load(&a.out)?
    } else {
        ProfileSet::default()
    };
    let chosen = DeviceProfile {
        threads: best.threads,
        chunk_pixels: best.chunk_pixels,
        block_pixels: best.block_pixels,
        ..base
    };
    set.upsert(chosen.clone());
    set.save(&a.out)?;
    println!(
        "best: {} threads, chunk {} block {} ({:.2} pixels/s); written to {}",
        chosen.threads,
        chosen.chunk_pixels,
        chosen.block_pixels,
        best.pixels_per_s,
        a.out.display()
    );
    Ok(())
}

fn run_synth_ckpt(a: SynthCkptArgs) -> Result<()> {
    let cfg = ModelConfig {
        latent_dim: a.latent_dim,
        num_layers: a.num_layers,
        nhead: a.nhead,
        dim_feedforward: a.dim_feedforward,
        repr_dim: 128,
    };
    if !cfg.d_model().is_multiple_of(cfg.nhead) {
        bail!("4 x latent_dim must be divisible by nhead");
    }
    write_safetensors(&random_checkpoint(&cfg, a.seed), &a.out)?;
    eprintln!("wrote {} ({} params)", a.out.display(), cfg.param_count());
    Ok(())
}

fn run_synth_tile(a: SynthTileArgs) -> Result<()> {
    let t = TileInputs::synthetic(&SynthTile {
        height: a.height,
        width: a.width,
        s2_frames: a.s2_frames,
        s1_asc_frames: a.s1_asc_frames,
        s1_desc_frames: a.s1_desc_frames,
        clear: a.clear,
        seed: a.seed,
    });
    t.write(&a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
