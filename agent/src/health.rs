//! The host health report: what this machine looks like now, sent with every heartbeat.
//!
//! [`HealthCollector`] keeps sysinfo's state between calls and refreshes only
//! what changes (memory, CPU time, the work directory's file system, load,
//! open descriptors); the OS version, CPU model and core count are read once.
//! [`collect`] is the one-shot form for callers that report once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flotilla_core::health::HostHealth;
use sysinfo::{CpuRefreshKind, DiskRefreshKind, Disks, MemoryRefreshKind, RefreshKind, System};

/// How often the mount table is read again, in case the work directory's file
/// system was mounted or replaced after start-up. Between re-reads only the
/// chosen file system is `statvfs`-ed: a Kubernetes node can have hundreds of
/// mounts, and a heartbeat should not stat them all.
const MOUNT_RELIST_INTERVAL: Duration = Duration::from_secs(300);

/// Collects [`HostHealth`] repeatedly and cheaply. Create one per agent and
/// call [`HealthCollector::collect`] at each heartbeat.
pub struct HealthCollector {
    /// The work directory, canonicalized when it exists (so a symlinked work
    /// directory is attributed to the file system it really lives on).
    workdir: PathBuf,
    /// Memory and CPU-time counters; refreshed on every `collect`.
    system: System,
    /// When the CPU counters were last read: the host's busy fraction is
    /// the change between two readings, which sysinfo needs at least
    /// [`sysinfo::MINIMUM_CPU_UPDATE_INTERVAL`] apart to be meaningful.
    cpu_read_at: Instant,
    /// The busy fraction of the last interval long enough to measure.
    cpu_busy: Option<f64>,
    /// The file systems sysinfo knows; `disk` indexes into it.
    disks: Disks,
    /// Index in `disks` of the file system holding `workdir`, if any matched.
    disk: Option<usize>,
    /// When `disks` was last listed from the mount table.
    listed_at: Instant,
    // Read once: these do not change while the agent runs.
    os_version: Option<String>,
    cpu_model: String,
    cores: u32,
}

/// The work directory's file system as `df` counts it: the bytes the agent
/// may still write, and the capacity they are a share of (used plus
/// available), so that `1 - free / total` is df's Use%. Blocks neither
/// used nor available to the agent (root's reserve, or space a VM's disk
/// reports but does not offer) are left out: counted in the total, as
/// sysinfo's total does, a 252 GB disk with 44 GB used and 48 GB available
/// (df: 49 %) read as 81 % full, and its agents stopped leasing at 90 %.
#[cfg(unix)]
fn df_space(dir: &Path) -> Option<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    let unit = s.fragment_size() as u64;
    let used = (s.blocks() as u64).saturating_sub(s.blocks_free() as u64) * unit;
    let available = s.blocks_available() as u64 * unit;
    Some((available, used + available))
}

#[cfg(not(unix))]
fn df_space(_dir: &Path) -> Option<(u64, u64)> {
    None
}

impl HealthCollector {
    /// Reads the static facts (OS version, CPU model, cores) and the mount
    /// table. `workdir` need not exist yet; it is resolved as far as it does.
    pub fn new(workdir: &Path) -> Self {
        let workdir = resolve(workdir);
        let mut system = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        );
        let cpu_model = system
            .cpus()
            .first()
            .map(|cpu| {
                let brand = cpu.brand().trim();
                // Some ARM Linux kernels expose no model name, only a vendor.
                if brand.is_empty() {
                    cpu.vendor_id().trim().to_owned()
                } else {
                    brand.to_owned()
                }
            })
            .unwrap_or_default();
        // The first reading: the next `collect` reports the change since.
        system.refresh_cpu_usage();
        let cores = match system.cpus().len() {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let disks =
            Disks::new_with_refreshed_list_specifics(DiskRefreshKind::nothing().with_storage());
        let disk = disk_holding(&disks, &workdir);
        Self {
            workdir,
            system,
            cpu_read_at: Instant::now(),
            cpu_busy: None,
            disks,
            disk,
            listed_at: Instant::now(),
            os_version: System::long_os_version(),
            cpu_model,
            cores: u32::try_from(cores).unwrap_or(u32::MAX),
        }
    }

    /// The work directory as resolved for the disk lookup.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// Refreshes the changing values and returns a full report.
    pub fn collect(&mut self) -> HostHealth {
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        self.refresh_disk();
        self.refresh_cpu();
        let (disk_free_bytes, disk_total_bytes) = df_space(&self.workdir).unwrap_or_else(|| {
            self.disk
                .and_then(|i| self.disks.list().get(i))
                .map_or((0, 0), |d| (d.available_space(), d.total_space()))
        });
        HostHealth {
            os: std::env::consts::OS.to_owned(),
            os_version: self.os_version.clone(),
            arch: std::env::consts::ARCH.to_owned(),
            cpu_model: self.cpu_model.clone(),
            cores: self.cores,
            memory_total_bytes: self.system.total_memory(),
            memory_available_bytes: self.system.available_memory(),
            disk_free_bytes,
            disk_total_bytes,
            open_fds: open_fds(),
            max_fds: proc_self::max_fds(),
            process_cpu_seconds: proc_self::cpu_seconds(),
            process_resident_bytes: proc_self::resident_bytes(),
            load_1m: load_1m(),
            cpu_busy: self.cpu_busy,
        }
    }

    /// Reads the CPU counters again if the last reading is far enough back
    /// to measure against; a `collect` sooner than that (a registration
    /// right after `new`) keeps the previous figure.
    fn refresh_cpu(&mut self) {
        if self.cpu_read_at.elapsed() < sysinfo::MINIMUM_CPU_UPDATE_INTERVAL {
            return;
        }
        self.system.refresh_cpu_usage();
        self.cpu_read_at = Instant::now();
        let percent = f64::from(self.system.global_cpu_usage());
        self.cpu_busy = percent
            .is_finite()
            .then(|| (percent / 100.0).clamp(0.0, 1.0));
    }

    /// Re-reads the chosen file system's free and total space, and the whole
    /// mount table when it is stale or no file system matched.
    fn refresh_disk(&mut self) {
        let stale = self.listed_at.elapsed() >= MOUNT_RELIST_INTERVAL;
        if stale || self.disk.is_none() {
            // The work directory may have been created since `new`.
            self.workdir = resolve(&self.workdir);
            self.disks
                .refresh_specifics(true, DiskRefreshKind::nothing().with_storage());
            self.disk = disk_holding(&self.disks, &self.workdir);
            self.listed_at = Instant::now();
            return; // the re-list already read the space of every file system
        }
        if let Some(disk) = self.disk.and_then(|i| self.disks.list_mut().get_mut(i)) {
            disk.refresh_specifics(DiskRefreshKind::nothing().with_storage());
        }
    }
}

/// One report, from a fresh collector. Prefer a long-lived
/// [`HealthCollector`] when reporting repeatedly.
pub fn collect(workdir: &Path) -> HostHealth {
    HealthCollector::new(workdir).collect()
}

/// The canonical form of `path`, or of its longest existing ancestor with the
/// rest appended (a work directory that does not exist yet still lives on the
/// file system of its parent). Relative paths are taken from the current
/// directory.
fn resolve(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            return rest.iter().rev().fold(canonical, |p, c| p.join(c));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// The index of the file system whose mount point is the longest
/// (component-wise) prefix of `path`: `/work` holds `/work/x`, `/workspace`
/// does not.
fn disk_holding(disks: &Disks, path: &Path) -> Option<usize> {
    disks
        .list()
        .iter()
        .enumerate()
        .filter(|(_, d)| path.starts_with(d.mount_point()))
        .max_by_key(|(_, d)| d.mount_point().components().count())
        .map(|(i, _)| i)
}

/// Open file descriptors of this process, where the platform lists them.
fn open_fds() -> Option<u64> {
    let dir = if cfg!(target_os = "linux") {
        "/proc/self/fd"
    } else if cfg!(any(
        target_os = "macos",
        target_os = "ios",
        target_os = "freebsd",
        target_os = "dragonfly"
    )) {
        // On FreeBSD without fdescfs mounted this lists only 0–2: an
        // undercount, but still a number that moves with a leak above 2.
        "/dev/fd"
    } else {
        return None;
    };
    let entries = std::fs::read_dir(dir).ok()?;
    // Reading the directory holds one descriptor of its own; do not count it.
    let n = entries.filter(|e| e.is_ok()).count() as u64;
    Some(n.saturating_sub(1))
}

/// This process's open-file limit, CPU time and resident memory, from
/// `/proc/self` on Linux; `None` elsewhere.
mod proc_self {
    /// Clock ticks per second in `/proc/self/stat`: `USER_HZ`, which the
    /// kernel fixes at 100 for user space on every architecture (Prometheus's
    /// own procfs reader assumes the same).
    const USER_HZ: f64 = 100.0;

    fn read(file: &str) -> Option<String> {
        if cfg!(target_os = "linux") {
            std::fs::read_to_string(format!("/proc/self/{file}")).ok()
        } else {
            None
        }
    }

    /// The soft limit on open files; `None` when unlimited or unknown.
    pub fn max_fds() -> Option<u64> {
        let limits = read("limits")?;
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line["Max open files".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// User plus system CPU time, in seconds.
    pub fn cpu_seconds() -> Option<f64> {
        let stat = read("stat")?;
        // The command name (field 2) may hold spaces and parentheses; the
        // fields after its closing parenthesis start at field 3 (state), so
        // utime (14) and stime (15) are the 12th and 13th of them.
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace().skip(11);
        let utime: u64 = fields.next()?.parse().ok()?;
        let stime: u64 = fields.next()?.parse().ok()?;
        Some((utime + stime) as f64 / USER_HZ)
    }

    /// Resident set size in bytes (`VmRSS`, which the kernel gives in kB).
    pub fn resident_bytes() -> Option<u64> {
        let status = read("status")?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line["VmRSS:".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kb * 1024)
    }
}

/// The 1-minute load average; Windows has none.
fn load_1m() -> Option<f64> {
    if cfg!(windows) {
        None
    } else {
        Some(System::load_average().one)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work directory's disk as df reports it (used + available, not
    /// the raw size): on a disk with blocks reserved for root, or this
    /// VM's, whose size is far more than used plus available, the raw size
    /// made the agent look nearly full.
    #[cfg(target_os = "linux")]
    #[test]
    fn disk_space_reads_as_df_does() {
        let (free, total) = df_space(Path::new("/")).expect("statvfs of /");
        let out = std::process::Command::new("df")
            .args(["-B1", "--output=used,avail", "/"])
            .output()
            .expect("running df");
        let text = String::from_utf8(out.stdout).expect("df prints ASCII");
        let nums: Vec<u64> = text
            .lines()
            .nth(1)
            .expect("a line for /")
            .split_whitespace()
            .map(|n| n.parse().expect("a number"))
            .collect();
        let (used, avail) = (nums[0], nums[1]);
        // Other processes write between the two readings.
        assert!(free.abs_diff(avail) < 256 << 20, "{free} vs df's {avail}");
        assert!(
            total.abs_diff(used + avail) < 256 << 20,
            "{total} vs df's {}",
            used + avail
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn process_readings_are_there_on_linux() {
        let h = collect(&std::env::temp_dir());
        assert!(h.max_fds.is_some_and(|n| n > 0), "{h:?}");
        assert!(h.process_cpu_seconds.is_some(), "{h:?}");
        assert!(
            h.process_resident_bytes.is_some_and(|b| b > 1024 * 1024),
            "{h:?}"
        );
    }

    #[test]
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "windows"))]
    fn cpu_busy_is_measured_between_two_readings() {
        let mut c = HealthCollector::new(&std::env::temp_dir());
        assert_eq!(c.collect().cpu_busy, None, "nothing to measure against yet");
        std::thread::sleep(sysinfo::MINIMUM_CPU_UPDATE_INTERVAL + Duration::from_millis(50));
        let busy = c.collect().cpu_busy;
        assert!(busy.is_some_and(|b| (0.0..=1.0).contains(&b)), "{busy:?}");
    }

    #[test]
    fn resolve_keeps_missing_tail_under_canonical_parent() {
        let tmp = std::env::temp_dir()
            .canonicalize()
            .expect("temp dir exists");
        let p = resolve(&tmp.join("flotilla-no-such-dir").join("deeper"));
        assert_eq!(p, tmp.join("flotilla-no-such-dir").join("deeper"));
    }
}
