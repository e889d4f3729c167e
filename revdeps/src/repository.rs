//! Loading an opam repository from a directory or straight from a git object
//! database (`git ls-tree` + one `git cat-file --batch`), parsing in parallel.

use crate::error::{Error, FileError};
use crate::package::OpamData;
use crate::version::Version;
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Index of a package version in [`Repository::packages`].
pub type PkgId = u32;
/// Index of a package name in [`Repository::names`].
pub type NameId = u32;

#[derive(Clone, Debug)]
pub struct Package {
    pub name: NameId,
    pub version: Version,
    /// Where it came from, for messages (`packages/x/x.1/opam`).
    pub file: String,
    pub opam: OpamData,
}

/// Every parsed package version, sorted by name then version; ids are positions.
#[derive(Debug, Default)]
pub struct Repository {
    /// Names sorted bytewise; a [`NameId`] is a position here.
    pub names: Vec<String>,
    name_ids: HashMap<String, NameId>,
    pub packages: Vec<Package>,
    /// Per name, the range of its versions in `packages` (ascending versions).
    by_name: Vec<(PkgId, PkgId)>,
    /// Files that failed to parse; opam skips them too.
    pub errors: Vec<FileError>,
}

/// Where to read a repository from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Dir(PathBuf),
    Git { repo: PathBuf, rev: String },
}

impl Source {
    /// `PATH` (a directory with `packages/`, or a git repository at HEAD) or `PATH:REV`.
    pub fn parse(spec: &str) -> Source {
        let p = Path::new(spec);
        if p.exists() {
            if p.join("packages").is_dir() {
                return Source::Dir(p.to_path_buf());
            }
            return Source::Git {
                repo: p.to_path_buf(),
                rev: "HEAD".into(),
            };
        }
        match spec.rsplit_once(':') {
            Some((path, rev)) if !path.is_empty() && !rev.is_empty() => Source::Git {
                repo: PathBuf::from(path),
                rev: rev.to_string(),
            },
            _ => Source::Dir(p.to_path_buf()),
        }
    }

    /// The same source with a git revision resolved to its commit id, so
    /// that what it names cannot change under a cache keyed on it (`HEAD`
    /// after a `git pull` is another tree). A directory stays as it is.
    pub fn resolved(self) -> Result<Source, Error> {
        let Source::Git { repo, rev } = self else {
            return Ok(self);
        };
        let args = format!("rev-parse --verify {rev}^{{commit}}");
        if rev.starts_with('-') {
            return Err(git_err(
                &args,
                "a revision may not start with `-`; name a branch, tag or commit",
            ));
        }
        let out = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["rev-parse", "--verify", "--end-of-options"])
            .arg(format!("{rev}^{{commit}}"))
            .output()
            .map_err(|e| git_err(&args, e.to_string()))?;
        if !out.status.success() {
            return Err(git_err(
                &args,
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        Ok(Source::Git {
            repo,
            rev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        })
    }

    /// A key for a cache of loaded repositories: `PATH@COMMIT` for a
    /// resolved git source; for a directory, `PATH@COMMIT` of the checkout
    /// it is in (so a `git pull` there changes the key; uncommitted edits
    /// do not), or its path alone outside git.
    pub fn cache_key(&self) -> String {
        match self {
            Source::Git { repo, rev } => format!("{}@{rev}", repo.display()),
            Source::Dir(p) => {
                let head = Command::new("git")
                    .arg("-C")
                    .arg(p)
                    .args(["rev-parse", "--verify", "HEAD"])
                    .output()
                    .ok()
                    .filter(|o| o.status.success())
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
                match head {
                    Some(commit) => format!("{}@{commit}", p.display()),
                    None => p.display().to_string(),
                }
            }
        }
    }
}

/// `packages/…/NAME.VERSION/opam` → (name, version).
fn package_of_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("packages/")?;
    let dir = rest.strip_suffix("/opam")?;
    let last = dir.rsplit('/').next()?;
    let (n, v) = last.split_once('.')?;
    if n.is_empty() || v.is_empty() {
        return None;
    }
    Some((n, v))
}

impl Repository {
    pub fn load(source: &Source) -> Result<Repository, Error> {
        let files = match source {
            Source::Dir(d) => read_dir_files(d)?,
            Source::Git { repo, rev } => return read_git(repo, rev),
        };
        Ok(Self::from_files(files))
    }

    /// Builds a repository from `(path, contents)` pairs, paths relative to the root.
    pub fn from_files(files: Vec<(String, Vec<u8>)>) -> Repository {
        let parsed: Vec<Parsed> = files
            .into_par_iter()
            .filter_map(|(p, b)| parse_one(p, b))
            .collect();
        Self::assemble(parsed)
    }

    fn assemble(parsed: Vec<Parsed>) -> Repository {
        let mut ok = Vec::with_capacity(parsed.len());
        let mut errors = Vec::new();
        for r in parsed {
            match r {
                Ok(x) => ok.push(x),
                Err(e) => errors.push(e),
            }
        }
        ok.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| crate::version::compare(&a.1, &b.1))
                .then_with(|| a.1.cmp(&b.1))
        });
        ok.dedup_by(|b, a| a.0 == b.0 && a.1 == b.1);
        let mut repo = Repository {
            errors,
            ..Default::default()
        };
        for (n, v, file, opam) in ok {
            let id = repo.packages.len() as PkgId;
            let name = match repo.name_ids.get(&n) {
                Some(&nid) => {
                    repo.by_name[nid as usize].1 = id + 1;
                    nid
                }
                None => {
                    let nid = repo.names.len() as NameId;
                    repo.names.push(n.clone());
                    repo.name_ids.insert(n, nid);
                    repo.by_name.push((id, id + 1));
                    nid
                }
            };
            repo.packages.push(Package {
                name,
                version: Version::new(v),
                file,
                opam,
            });
        }
        repo
    }

    pub fn name_id(&self, name: &str) -> Option<NameId> {
        self.name_ids.get(name).copied()
    }

    /// All versions of a name, ascending.
    pub fn versions(&self, name: NameId) -> std::ops::Range<PkgId> {
        let (a, b) = self.by_name[name as usize];
        a..b
    }

    /// Versions of the package called `name`, empty if unknown.
    pub fn versions_of(&self, name: &str) -> std::ops::Range<PkgId> {
        self.name_id(name).map_or(0..0, |n| self.versions(n))
    }

    pub fn name(&self, id: PkgId) -> &str {
        &self.names[self.packages[id as usize].name as usize]
    }

    pub fn version(&self, id: PkgId) -> &str {
        self.packages[id as usize].version.as_str()
    }

    /// `name.version`.
    pub fn display(&self, id: PkgId) -> String {
        format!("{}.{}", self.name(id), self.version(id))
    }

    /// Finds `name.version` (split at the first dot, as opam does).
    pub fn find(&self, nv: &str) -> Result<PkgId, Error> {
        let (n, v) = nv
            .split_once('.')
            .ok_or_else(|| Error::BadPackage(nv.to_string()))?;
        self.versions_of(n)
            .find(|&id| self.version(id) == v)
            .ok_or_else(|| Error::UnknownPackage(nv.to_string()))
    }
}

type Parsed = Result<(String, String, String, OpamData), FileError>;

/// Parses one file if its path is a package's `opam`.
fn parse_one(path: String, bytes: Vec<u8>) -> Option<Parsed> {
    let (n, v) = package_of_path(&path)?;
    let (n, v) = (n.to_string(), v.to_string());
    Some(match std::str::from_utf8(&bytes) {
        Ok(src) => OpamData::parse(&path, src).map(|d| (n, v, path.clone(), d)),
        Err(e) => Err(FileError::Other {
            file: path.clone(),
            msg: format!("not UTF-8 ({e})"),
        }),
    })
}

fn read_dir_files(root: &Path) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let pk = root.join("packages");
    if !pk.is_dir() {
        return Err(Error::NotARepository(root.to_path_buf()));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let mut paths = Vec::new();
    let mut stack = vec![pk];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let e = e.map_err(io(&dir))?;
            let p = e.path();
            let ft = e.file_type().map_err(io(&p))?;
            if ft.is_dir() {
                stack.push(p);
            } else if e.file_name() == "opam" {
                paths.push(p);
            }
        }
    }
    paths
        .into_par_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(root)
                .unwrap_or(&p)
                .to_string_lossy()
                .replace(std::path::MAIN_SEPARATOR, "/");
            std::fs::read(&p).map(|b| (rel, b)).map_err(io(&p))
        })
        .collect()
}

fn git_err(args: &str, msg: impl Into<String>) -> Error {
    Error::Git {
        args: args.to_string(),
        msg: msg.into(),
    }
}

/// Reads `packages/` at `rev` from the object database, parsing chunks of
/// files on the rayon pool while `git cat-file` streams the next ones.
fn read_git(repo: &Path, rev: &str) -> Result<Repository, Error> {
    let out = std::sync::Mutex::new(Vec::new());
    let read = rayon::scope(|scope| {
        read_git_files(repo, rev, &mut |chunk: Vec<(String, Vec<u8>)>| {
            let out = &out;
            scope.spawn(move |_| {
                let parsed: Vec<Parsed> = chunk
                    .into_iter()
                    .filter_map(|(p, b)| parse_one(p, b))
                    .collect();
                out.lock()
                    .expect("no parser panics while holding the lock")
                    .extend(parsed);
            });
        })
    });
    read?;
    Ok(Repository::assemble(
        out.into_inner()
            .expect("no parser panics while holding the lock"),
    ))
}

fn read_git_files(
    repo: &Path,
    rev: &str,
    sink: &mut dyn FnMut(Vec<(String, Vec<u8>)>),
) -> Result<(), Error> {
    let ls_args = format!("ls-tree -r -z --full-tree {rev} -- packages");
    // The revision comes from a client; one starting with `-` would be read
    // as an option of git's.
    if rev.starts_with('-') {
        return Err(git_err(
            &ls_args,
            "a revision may not start with `-`; name a branch, tag or commit",
        ));
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["ls-tree", "-r", "-z", "--full-tree", rev, "--", "packages"])
        .output()
        .map_err(|e| git_err(&ls_args, e.to_string()))?;
    if !out.status.success() {
        return Err(git_err(
            &ls_args,
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    // Entries are "<mode> <type> <oid>\t<path>\0".
    let mut wanted: Vec<(String, String)> = Vec::new();
    for entry in out.stdout.split(|&b| b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((meta, path)) = entry.split_once('\t') else {
            continue;
        };
        let mut it = meta.split(' ');
        let (_, kind, oid) = (it.next(), it.next(), it.next());
        if kind == Some("blob") && package_of_path(path).is_some() {
            if let Some(oid) = oid {
                wanted.push((oid.to_string(), path.to_string()));
            }
        }
    }
    if wanted.is_empty() {
        return Err(Error::NotARepository(repo.join(rev)));
    }
    let cat_args = "cat-file --batch";
    let mut child = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| git_err(cat_args, e.to_string()))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| git_err(cat_args, "no stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| git_err(cat_args, "no stdout"))?;
    let oids: Vec<String> = wanted.iter().map(|(o, _)| o.clone()).collect();
    // Feed the requests from another thread so neither pipe can fill up and deadlock.
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = String::with_capacity(oids.len() * 41);
        for o in &oids {
            buf.push_str(o);
            buf.push('\n');
        }
        stdin.write_all(buf.as_bytes())
    });
    let mut r = BufReader::with_capacity(1 << 20, stdout);
    const CHUNK: usize = 256;
    let mut files = Vec::with_capacity(CHUNK);
    let mut header = String::new();
    for (_, path) in wanted {
        header.clear();
        r.read_line(&mut header)
            .map_err(|e| git_err(cat_args, e.to_string()))?;
        let size: usize = header
            .trim_end()
            .rsplit(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| git_err(cat_args, format!("unexpected reply {header:?}")))?;
        let mut buf = vec![0u8; size + 1];
        r.read_exact(&mut buf)
            .map_err(|e| git_err(cat_args, e.to_string()))?;
        buf.pop();
        files.push((path, buf));
        if files.len() == CHUNK {
            sink(std::mem::replace(&mut files, Vec::with_capacity(CHUNK)));
        }
    }
    sink(files);
    let _ = writer.join();
    let status = child.wait().map_err(|e| git_err(cat_args, e.to_string()))?;
    if !status.success() {
        return Err(git_err(cat_args, format!("exited with {status}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_revision_that_looks_like_an_option_is_refused() {
        let dir = std::env::temp_dir();
        let err = super::read_git_files(&dir, "--output=/tmp/flotilla-pwned", &mut |_| {})
            .expect_err("an option as a revision");
        assert!(err.to_string().contains("may not start with `-`"), "{err}");
        assert!(!std::path::Path::new("/tmp/flotilla-pwned").exists());
    }

    use super::*;

    #[test]
    fn paths() {
        assert_eq!(package_of_path("packages/a/a.1.0/opam"), Some(("a", "1.0")));
        assert_eq!(package_of_path("packages/a/a.1.0/files/opam"), None);
        assert_eq!(package_of_path("packages/a.1.0/opam"), Some(("a", "1.0")));
        assert_eq!(package_of_path("packages/a/a/opam"), None);
    }

    #[test]
    fn sources() {
        assert_eq!(
            Source::parse("/nonexistent/repo:abc123"),
            Source::Git {
                repo: "/nonexistent/repo".into(),
                rev: "abc123".into()
            }
        );
    }
}
