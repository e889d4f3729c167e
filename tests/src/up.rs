//! `flotilla up` as a child process: started in a data directory, ready
//! when it answers `/healthz`, stopped with SIGTERM (its PostgreSQL with
//! it) when dropped; and running the CLI against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Up {
    child: Child,
    pub log: PathBuf,
    pub data: PathBuf,
    pub url: String,
}

impl Up {
    /// Starts `flotilla up --data DIR/data` with one local agent of
    /// `capacity` slots on a free port and waits until it is healthy.
    pub fn start(dir: &Path, capacity: u32) -> Up {
        let data = dir.join("data");
        let log = dir.join("up.log");
        let child = Command::new(crate::binary("flotilla"))
            .args(["up", "--data", data.to_str().expect("a UTF-8 path")])
            .args(["--listen", "127.0.0.1:0", "--agents", "1", "--capacity"])
            .arg(capacity.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("creating up.log"))
            .spawn()
            .expect("starting flotilla up");
        let mut up = Up {
            child,
            log,
            data,
            url: String::new(),
        };
        let started = Instant::now();
        up.url = loop {
            if let Ok(url) = std::fs::read_to_string(up.data.join("server.url")) {
                let healthy = Command::new("curl")
                    .args(["-fs", &format!("{}/healthz", url.trim())])
                    .stdout(Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
                if healthy {
                    break url.trim().to_string();
                }
            }
            if let Ok(Some(status)) = up.child.try_wait() {
                panic!("flotilla up exited ({status}): {}", up.log_text());
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "flotilla up not ready after 120 s: {}",
                up.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        up
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `--server URL --token-file DATA/admin.token`, for the CLI.
    pub fn conn(&self) -> Vec<String> {
        vec![
            "--server".into(),
            self.url.clone(),
            "--token-file".into(),
            self.data.join("admin.token").to_string_lossy().into_owned(),
        ]
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
    }
}

/// Runs `program args`, panicking with its output unless it succeeds;
/// returns its stdout.
pub fn run(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
