//! The host health report an agent sends with every heartbeat.

use serde::{Deserialize, Serialize};

/// What an agent's host looks like right now. The server keeps the latest
/// report per agent and flags one whose work-directory disk is over
/// [`DISK_FULL_FRACTION`] full.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostHealth {
    /// `std::env::consts::OS`: "linux", "windows", "macos", "freebsd", …
    pub os: String,
    /// Long OS version, e.g. "Debian GNU/Linux 12 (bookworm)", when known.
    pub os_version: Option<String>,
    /// `std::env::consts::ARCH`: "x86_64", "aarch64", …
    pub arch: String,
    /// The CPU's brand string, e.g. "Intel(R) Xeon(R) Platinum 8480+".
    pub cpu_model: String,
    /// Logical cores.
    pub cores: u32,
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    /// Free and total bytes of the file system holding the agent's work
    /// directory.
    pub disk_free_bytes: u64,
    pub disk_total_bytes: u64,
    /// Open file descriptors (handles on Windows) of the agent process, when
    /// the platform can tell.
    pub open_fds: Option<u64>,
    /// The agent process's open-file limit (its soft `RLIMIT_NOFILE`), when
    /// the platform can tell: with `open_fds`, how near it is to running out.
    #[serde(default)]
    pub max_fds: Option<u64>,
    /// CPU time (user + system) the agent process has used since it
    /// started, in seconds; it restarts from 0 with the process.
    #[serde(default)]
    pub process_cpu_seconds: Option<f64>,
    /// Resident memory of the agent process, in bytes.
    #[serde(default)]
    pub process_resident_bytes: Option<u64>,
    /// 1-minute load average (absent on Windows).
    pub load_1m: Option<f64>,
    /// Fraction (0–1) of the host's CPU time, over all cores, that was busy
    /// between this report and the agent's previous reading; absent from a
    /// first report and from agents older than this field.
    #[serde(default)]
    pub cpu_busy: Option<f64>,
}

/// A work-directory disk fuller than this fraction is flagged.
pub const DISK_FULL_FRACTION: f64 = 0.90;

impl HostHealth {
    /// Fraction of the work-directory disk in use, if the total is known.
    pub fn disk_used_fraction(&self) -> Option<f64> {
        if self.disk_total_bytes == 0 {
            return None;
        }
        let used = self.disk_total_bytes.saturating_sub(self.disk_free_bytes);
        Some(used as f64 / self.disk_total_bytes as f64)
    }

    /// True when the work-directory disk is over [`DISK_FULL_FRACTION`] full.
    pub fn disk_nearly_full(&self) -> bool {
        self.disk_used_fraction()
            .is_some_and(|f| f > DISK_FULL_FRACTION)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_without_the_process_fields_still_parses() {
        // What agents older than the process fields send.
        let old = serde_json::json!({
            "os": "linux", "os_version": null, "arch": "x86_64", "cpu_model": "x",
            "cores": 2, "memory_total_bytes": 1, "memory_available_bytes": 1,
            "disk_free_bytes": 1, "disk_total_bytes": 2, "open_fds": 7, "load_1m": 0.5
        });
        let h: HostHealth = serde_json::from_value(old).expect("an old report parses");
        assert_eq!(h.open_fds, Some(7));
        assert_eq!((h.max_fds, h.process_cpu_seconds), (None, None));
        assert_eq!(h.cpu_busy, None);
    }

    #[test]
    fn disk_flag_trips_only_above_ninety_percent() {
        let mut h = HostHealth {
            disk_total_bytes: 1000,
            disk_free_bytes: 100,
            ..Default::default()
        };
        assert!(!h.disk_nearly_full(), "exactly 90 % used is not over 90 %");
        h.disk_free_bytes = 99;
        assert!(h.disk_nearly_full());
        h.disk_total_bytes = 0;
        assert!(!h.disk_nearly_full(), "unknown total is not flagged");
    }
}
