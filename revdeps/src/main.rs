//! `opam-revdeps`: prints the reverse dependencies of a package version.

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use opam_revdeps::{answer, explain, phase1, phase2, Query, Repository, Source, Variant};
use std::io::Write;
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum QueryArg {
    Union,
    Depopts,
    Recursive,
    WithTestDepopts,
}

impl From<QueryArg> for Query {
    fn from(q: QueryArg) -> Query {
        match q {
            QueryArg::Union => Query::Union,
            QueryArg::Depopts => Query::Depopts,
            QueryArg::Recursive => Query::Recursive,
            QueryArg::WithTestDepopts => Query::WithTestDepopts,
        }
    }
}

/// Reverse dependencies of TARGET as opam 2.1.2's revdeps queries give them,
/// coinstallable with TARGET and the compiler; `name.version` lines on stdout,
/// progress and timings on stderr.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// opam repository: a directory, a git repository (HEAD), or PATH:REV read
    /// straight from the git object database.
    #[arg(long)]
    repo: String,
    /// The switch invariant, `name.version`.
    #[arg(long)]
    compiler: String,
    #[arg(long, default_value = "x86_64")]
    arch: String,
    #[arg(long, default_value = "linux")]
    os: String,
    #[arg(long, default_value = "debian")]
    os_family: String,
    #[arg(long, default_value = "debian")]
    os_distribution: String,
    #[arg(long, default_value = "12")]
    os_version: String,
    #[arg(long, default_value = "2.1.2")]
    opam_version: String,
    #[arg(long, value_enum, default_value = "union")]
    query: QueryArg,
    /// Worker threads for phase 2 (default: all cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// System packages the host cannot provide, one a line (default: the
    /// built-in Debian 12 list when the host is Debian 12, else none).
    #[arg(long, value_name = "FILE")]
    missing_depexts: Option<std::path::PathBuf>,
    /// Print the system packages the repository's depexts select on this
    /// host, one a line (to build a --missing-depexts list), and exit.
    #[arg(long)]
    list_host_depexts: bool,
    /// Say why PKG (`name.version`) is in or out, instead of listing.
    #[arg(long, value_name = "PKG")]
    explain: Option<String>,
    /// The target package version, `name.version`.
    target: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let t0 = Instant::now();
    let (cname, cversion) = args
        .compiler
        .split_once('.')
        .with_context(|| format!("--compiler {}: expected name.version", args.compiler))?;
    let missing_depexts = match &args.missing_depexts {
        Some(f) => opam_revdeps::variant::parse_name_list(
            &std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        ),
        None if args.os_family == "debian"
            && args.os_distribution == "debian"
            && args.os_version == "12" =>
        {
            opam_revdeps::variant::parse_name_list(opam_revdeps::variant::DEBIAN12_MISSING_DEPEXTS)
        }
        None => Default::default(),
    };
    let variant = Variant {
        missing_depexts,
        compiler_name: cname.to_string(),
        compiler_version: cversion.to_string(),
        arch: args.arch,
        os: args.os,
        os_family: args.os_family,
        os_distribution: args.os_distribution,
        os_version: args.os_version,
        opam_version: args.opam_version,
    };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if let Some(j) = args.jobs {
        // Parsing and phase 1 use rayon's pool; keep them within --jobs too.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(j.max(1))
            .build_global();
    }
    let repo = Repository::load(&Source::parse(&args.repo))
        .with_context(|| format!("loading {}", args.repo))?;
    for e in &repo.errors {
        eprintln!("warning: skipped {e}");
    }
    eprintln!(
        "loaded {} package versions ({} names) in {:.2}s",
        repo.packages.len(),
        repo.names.len(),
        t0.elapsed().as_secs_f64()
    );
    if args.list_host_depexts {
        for n in opam_revdeps::phase2::host_depexts(&repo, &variant) {
            println!("{n}");
        }
        return Ok(());
    }
    let target = repo.find(&args.target)?;
    if repo.find(&args.compiler).is_err() {
        bail!("compiler {} is not in the repository", args.compiler);
    }
    let query: Query = args.query.into();
    if let Some(pkg) = &args.explain {
        let p = repo.find(pkg)?;
        print!("{}", explain::explain(&repo, &variant, target, p, query));
        return Ok(());
    }
    let t1 = Instant::now();
    let cands = phase1(&repo, &variant, target, query);
    eprintln!(
        "phase 1: {} candidates in {:.2}s",
        cands.list.len(),
        t1.elapsed().as_secs_f64()
    );
    let t2 = Instant::now();
    let found = phase2(&repo, &variant, target, &cands.list, jobs);
    eprintln!(
        "phase 2: {} coinstallable in {:.2}s on {jobs} threads",
        found.len(),
        t2.elapsed().as_secs_f64()
    );
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for l in answer::lines(&repo, query, &found) {
        writeln!(out, "{l}")?;
    }
    out.flush()?;
    eprintln!("total {:.2}s", t0.elapsed().as_secs_f64());
    Ok(())
}
