//! Finds the system libdnnl (oneDNN 2.x) and links it, or fails with what to install.
//!
//! Debian's libdnnl-dev ships no pkg-config file (checked on bookworm,
//! 2.6.3-1), so pkg-config is not used: the headers and the library are looked
//! for in `DNNL_ROOT` (if set) and the usual system prefixes. The version and
//! CPU threading runtime are read from `dnnl_version.h`/`dnnl_config.h`, because
//! the hand-written declarations in `src/sys.rs` match the 2.x ABI only and the
//! per-thread thread count needs to know whether the runtime is OpenMP.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const INSTALL_HINT: &str = "install it with `apt-get install libdnnl-dev` (Debian/Ubuntu), \
     or set DNNL_ROOT to a oneDNN 2.x prefix holding include/oneapi/dnnl and lib/libdnnl.so; \
     crates that use `onednn` optionally should leave their oneDNN feature off on this machine";

fn main() {
    println!("cargo:rerun-if-env-changed=DNNL_ROOT");
    println!("cargo:rustc-check-cfg=cfg(dnnl_omp)");

    let root = env::var_os("DNNL_ROOT").map(PathBuf::from);
    let include_dirs: Vec<PathBuf> = root
        .iter()
        .map(|r| r.join("include"))
        .chain(["/usr/include", "/usr/local/include"].map(PathBuf::from))
        .collect();
    let multiarch = format!(
        "/usr/lib/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default()
    );
    let lib_dirs: Vec<PathBuf> = root
        .iter()
        .flat_map(|r| [r.join("lib"), r.join("lib64")])
        .chain(
            [
                multiarch.as_str(),
                "/usr/lib",
                "/usr/lib64",
                "/usr/local/lib",
                "/usr/local/lib64",
            ]
            .map(PathBuf::from),
        )
        .collect();

    let Some(include) = include_dirs
        .iter()
        .find(|d| d.join("oneapi/dnnl/dnnl.h").is_file())
    else {
        fail(&format!(
            "oneDNN headers (oneapi/dnnl/dnnl.h) not found in {include_dirs:?}"
        ));
    };
    let Some(lib_dir) = lib_dirs.iter().find(|d| d.join("libdnnl.so").exists()) else {
        fail(&format!("libdnnl.so not found in {lib_dirs:?}"));
    };

    let version = read(&include.join("oneapi/dnnl/dnnl_version.h"));
    let major = define_value(&version, "DNNL_VERSION_MAJOR");
    if major.as_deref() != Some("2") {
        fail(&format!(
            "found oneDNN major version {} in {}, but this crate's declarations are for the 2.x ABI \
             (3.x made memory descriptors opaque)",
            major.as_deref().unwrap_or("?"),
            include.display()
        ));
    }
    let config = read(&include.join("oneapi/dnnl/dnnl_config.h"));
    let runtime = define_value(&config, "DNNL_CPU_RUNTIME");
    if runtime.as_deref() == Some("DNNL_RUNTIME_OMP") {
        println!("cargo:rustc-cfg=dnnl_omp");
        // libdnnl already depends on libgomp; linking it directly lets us call
        // omp_set_num_threads for the calling thread (see src/threading.rs).
        println!("cargo:rustc-link-lib=dylib=gomp");
    }

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=dnnl");
    println!("cargo:include={}", include.display());
    println!(
        "cargo:rerun-if-changed={}",
        include.join("oneapi/dnnl/dnnl_version.h").display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}

fn read(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())))
}

/// The value of `#define NAME VALUE` in a header, if present.
fn define_value(header: &str, name: &str) -> Option<String> {
    header.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("#define") && words.next() == Some(name))
            .then(|| words.next().map(str::to_owned))
            .flatten()
    })
}

fn fail(why: &str) -> ! {
    // stderr of a failed build script is shown by cargo; exiting (not
    // panicking) keeps the message free of a backtrace.
    eprintln!("error: onednn: {why}; {INSTALL_HINT}");
    std::process::exit(1);
}
