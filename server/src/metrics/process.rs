//! The server process's own readings from `/proc/self`: open and allowed
//! file descriptors, resident memory, CPU time, start time (Linux only).

/// Clock ticks per second in `/proc/self/stat`: `USER_HZ`, which the kernel
/// fixes at 100 for user space on every architecture (Prometheus's procfs
/// reader assumes the same).
const USER_HZ: f64 = 100.0;

/// One reading. Each field is `None` where `/proc` could not tell.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Process {
    pub open_fds: Option<u64>,
    /// The soft `RLIMIT_NOFILE`; `None` when unlimited.
    pub max_fds: Option<u64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    /// User plus system CPU time since start.
    pub cpu_seconds: Option<f64>,
    /// Seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
}

impl Process {
    /// This process now. Cheap: four small files and one directory listing.
    pub fn read() -> Process {
        if !cfg!(target_os = "linux") {
            return Process::default();
        }
        let proc_file = |name: &str| std::fs::read_to_string(format!("/proc/self/{name}")).ok();
        let stat = proc_file("stat").and_then(|s| Stat::parse(&s));
        let boot_time = proc_file("../stat").and_then(|s| boot_time(&s));
        let status = proc_file("status").unwrap_or_default();
        Process {
            // Listing the directory opens one descriptor of its own.
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| (d.count() as u64).saturating_sub(1)),
            max_fds: proc_file("limits").and_then(|s| max_open_files(&s)),
            resident_bytes: status_kb(&status, "VmRSS:"),
            virtual_bytes: status_kb(&status, "VmSize:"),
            cpu_seconds: stat.as_ref().map(|s| s.cpu_ticks as f64 / USER_HZ),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / USER_HZ),
        }
    }
}

/// What `/proc/self/stat` says that matters here.
#[derive(Debug, PartialEq)]
struct Stat {
    /// utime + stime.
    cpu_ticks: u64,
    /// Start time after boot.
    start_ticks: u64,
}

impl Stat {
    fn parse(stat: &str) -> Option<Stat> {
        // The command name (field 2) may hold spaces and parentheses; the
        // fields after its last `)` start at field 3, so utime (14), stime
        // (15) and starttime (22) are its 12th, 13th and 20th.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| fields.get(i)?.parse::<u64>().ok();
        Some(Stat {
            cpu_ticks: field(11)? + field(12)?,
            start_ticks: field(19)?,
        })
    }
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

/// A `kB` line of `/proc/self/status`, in bytes.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis, as `comm` allows.
        let stat = "4242 (tok io) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 50 0 0 20 0 12 0 8100 123456789 4000 18446744073709551615";
        assert_eq!(
            Stat::parse(stat),
            Some(Stat {
                cpu_ticks: 300,
                start_ticks: 8100
            })
        );
        assert_eq!(Stat::parse("garbage"), None);
    }

    #[test]
    fn limits_and_status_lines_parse() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63535                63535                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(
            max_open_files(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
        let status = "Name:\tflotilla\nVmSize:\t  200000 kB\nVmRSS:\t   51200 kB\n";
        assert_eq!(status_kb(status, "VmRSS:"), Some(51200 * 1024));
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_process_reads() {
        let p = Process::read();
        assert!(p.open_fds.is_some_and(|n| n >= 3), "{p:?}");
        assert!(p.resident_bytes.is_some_and(|b| b > 0), "{p:?}");
        assert!(p.cpu_seconds.is_some(), "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_secs_f64();
        let started = p.start_time_seconds.expect("a start time");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0 * 365.0,
            "{p:?}"
        );
    }
}
