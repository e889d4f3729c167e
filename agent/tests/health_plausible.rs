//! The health report has plausible values on the machine running the tests.

use flotilla_agent::health::{collect, HealthCollector};

#[test]
fn report_is_plausible_here() {
    let dir = tempfile::tempdir().expect("temp dir");
    let h = collect(dir.path());
    assert_eq!(h.os, std::env::consts::OS);
    assert_eq!(h.arch, std::env::consts::ARCH);
    assert!(h.cores >= 1, "cores {}", h.cores);
    assert!(
        h.memory_total_bytes > 0,
        "memory total {}",
        h.memory_total_bytes
    );
    assert!(
        h.memory_available_bytes <= h.memory_total_bytes,
        "available {} > total {}",
        h.memory_available_bytes,
        h.memory_total_bytes
    );
    assert!(h.disk_total_bytes > 0, "disk total {}", h.disk_total_bytes);
    assert!(
        h.disk_free_bytes <= h.disk_total_bytes,
        "disk free {} > total {}",
        h.disk_free_bytes,
        h.disk_total_bytes
    );
    if cfg!(target_os = "linux") {
        assert!(
            h.open_fds.is_some_and(|n| n > 0),
            "open fds {:?}",
            h.open_fds
        );
    }
    if cfg!(unix) {
        assert!(h.load_1m.is_some_and(|l| l >= 0.0), "load {:?}", h.load_1m);
    } else {
        assert_eq!(h.load_1m, None);
    }
}

#[test]
fn collector_reports_repeatedly_and_for_a_missing_workdir() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Not created yet: the report is about the file system of its parent.
    let mut c = HealthCollector::new(&dir.path().join("not-yet"));
    let first = c.collect();
    let second = c.collect();
    assert!(first.disk_total_bytes > 0);
    assert_eq!(first.disk_total_bytes, second.disk_total_bytes);
    assert_eq!(first.cpu_model, second.cpu_model);
    assert_eq!(first.cores, second.cores);
}

#[cfg(target_os = "linux")]
#[test]
fn open_fds_counts_new_descriptors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = HealthCollector::new(dir.path());
    let before = c.collect().open_fds.expect("linux lists /proc/self/fd");
    let files: Vec<_> = (0..20)
        .map(|i| std::fs::File::create(dir.path().join(format!("f{i}"))).expect("create"))
        .collect();
    let after = c.collect().open_fds.expect("linux lists /proc/self/fd");
    // Other tests in this binary run in parallel threads and open files too,
    // so only a lower bound holds.
    assert!(after >= before + 10, "before {before}, after {after}");
    drop(files);
}
