//! A process's open descriptors, counted from /proc (Linux), for tests
//! that check a server gives back what its clients made it open.

/// Raises this process's soft limit on open files to the hard limit: a test
/// that makes a few thousand sockets may start with 1024.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// How many descriptors process `pid` has open.
pub fn open(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("reading the server's /proc/PID/fd")
        .count()
}

/// Of those, the TCP connections to its local `port` (a server's clients),
/// found by socket inode in the process's /proc/PID/net/tcp{,6}.
pub fn tcp_connections(pid: u32, port: u16) -> usize {
    let mut inodes = std::collections::HashSet::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT; state 0A is LISTEN.
            let local_port = f[1].rsplit(':').next().unwrap_or("");
            if u16::from_str_radix(local_port, 16) == Ok(port) && f[3] != "0A" {
                inodes.insert(f[9].to_string());
            }
        }
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .filter(|inode| inodes.contains(inode))
        .count()
}
