//! Server and agent processes. Each is killed when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::api::Api;

/// Options for a server under test.
#[derive(Debug, Clone)]
pub struct ServerOpts {
    pub database_url: String,
    pub store: String,
    /// A fixed address (to restart on the same one) or port 0.
    pub listen: SocketAddr,
    pub lease_ttl_ms: u64,
    pub backoff_base_ms: u64,
    pub env: Vec<(String, String)>,
}

/// The TLS of a server under test: its certificate and key (PEM), and the
/// CA certificate its clients are given (`--ca-file`).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

pub struct Server {
    pub opts: ServerOpts,
    pub dir: PathBuf,
    pub addr: SocketAddr,
    pub admin_token: String,
    /// Set when it serves HTTPS.
    pub tls: Option<TlsFiles>,
    child: Child,
}

impl Server {
    /// Runs the CLI against this server with the admin token: Ok((stdout,
    /// stderr)) where it succeeds, Err(its stdout and stderr) where not.
    pub async fn cli(&self, args: &[&str]) -> Result<(String, String), String> {
        let out = tokio::process::Command::new(crate::binary("flotilla"))
            .args(args)
            .args(["--server", &self.url()])
            .env("FLOTILLA_TOKEN", &self.admin_token)
            .env("FLOTILLA_LOG", "warn")
            .kill_on_drop(true)
            .output()
            .await
            .expect("running the flotilla CLI");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            Ok((stdout, stderr))
        } else {
            Err(format!("{stdout}{stderr}"))
        }
    }

    /// Starts `flotilla serve` and waits until it is healthy.
    pub async fn start(dir: &Path, opts: ServerOpts) -> Server {
        Server::start_with(dir, opts, None).await
    }

    /// Starts `flotilla serve --tls-cert --tls-key` and waits until it is
    /// healthy; its API client and agents trust `tls.ca`.
    pub async fn start_tls(dir: &Path, opts: ServerOpts, tls: TlsFiles) -> Server {
        Server::start_with(dir, opts, Some(tls)).await
    }

    async fn start_with(dir: &Path, opts: ServerOpts, tls: Option<TlsFiles>) -> Server {
        let token_file = dir.join("admin.token");
        let mut cmd = Command::new(crate::binary("flotilla"));
        // The URL holds the database password: in the environment, which
        // only this user can read, not on the command line.
        cmd.arg("serve")
            .env("FLOTILLA_DATABASE_URL", &opts.database_url)
            .arg("--store")
            .arg(&opts.store)
            .arg("--listen")
            .arg(opts.listen.to_string())
            .arg("--admin-token-file")
            .arg(&token_file)
            .arg("--lease-ttl-ms")
            .arg(opts.lease_ttl_ms.to_string())
            .arg("--backoff-base-ms")
            .arg(opts.backoff_base_ms.to_string())
            .env("FLOTILLA_LOG", "warn")
            .envs(opts.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(tls) = &tls {
            cmd.arg("--tls-cert")
                .arg(&tls.cert)
                .arg("--tls-key")
                .arg(&tls.key);
        }
        let mut child = cmd.spawn().expect("spawning flotilla serve");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut lines = BufReader::new(stdout).lines();
        let addr: SocketAddr = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = lines.next_line().await.expect("reading server stdout") {
                let url = line
                    .strip_prefix("flotilla: listening on http://")
                    .or_else(|| line.strip_prefix("flotilla: listening on https://"));
                if let Some(url) = url {
                    return url.parse().expect("server prints its address");
                }
            }
            panic!("server exited before listening");
        })
        .await
        .expect("server starts within 120 s");
        // Keep draining stdout so the server never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let admin_token = std::fs::read_to_string(&token_file)
            .expect("server wrote the admin token")
            .trim()
            .to_string();
        let server = Server {
            opts,
            dir: dir.to_path_buf(),
            addr,
            admin_token,
            tls,
            child,
        };
        server.wait_healthy(Duration::from_secs(60)).await;
        server
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The server's process id (to count its descriptors).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server is running")
    }

    pub fn api(&self) -> Api {
        let api = Api::new(&self.url(), &self.admin_token);
        match &self.tls {
            Some(tls) => Api {
                http: client_trusting(&tls.ca),
                ..api
            },
            None => api,
        }
    }

    pub async fn wait_healthy(&self, timeout: Duration) {
        let url = format!("{}/healthz", self.url());
        let http = self.api().http;
        crate::eventually("the server to be healthy", timeout, || {
            let req = http.get(&url).timeout(Duration::from_secs(2)).send();
            async move { matches!(req.await, Ok(r) if r.status().is_success()) }
        })
        .await;
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("killing the server");
    }

    /// Starts a new server process with the same options on the same
    /// address (the old one must be dead).
    pub async fn restart(&mut self) {
        let mut opts = self.opts.clone();
        opts.listen = self.addr;
        let fresh = Server::start_with(&self.dir, opts, self.tls.clone()).await;
        *self = fresh;
    }
}

pub struct Agent {
    pub name: String,
    child: Child,
}

impl Agent {
    /// Starts `flotilla-agent` with a fresh token for `name`, given in a
    /// 0600 file beside its work directory (agents take no token on the
    /// command line or in the environment).
    /// Given a TLS server's CA with `--ca-file`.
    pub async fn start(server: &Server, name: &str, capacity: u32, extra: &[&str]) -> Agent {
        let token = server.api().agent_token(name).await;
        let agents = server.dir.join("agents");
        let workdir = agents.join(name);
        std::fs::create_dir_all(&workdir).expect("agent workdir");
        let token_file = agents.join(format!("{name}.token"));
        write_private(&token_file, &token);
        let mut cmd = Command::new(crate::binary("flotilla-agent"));
        if let Some(tls) = &server.tls {
            cmd.arg("--ca-file").arg(&tls.ca);
        }
        let child = cmd
            .arg("--server")
            .arg(server.url())
            .arg("--token-file")
            .arg(&token_file)
            .arg("--name")
            .arg(name)
            .arg("--capacity")
            .arg(capacity.to_string())
            .arg("--workdir")
            .arg(&workdir)
            .arg("--kill-grace-s")
            .arg("2")
            .args(extra)
            .env("FLOTILLA_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawning flotilla-agent");
        Agent {
            name: name.to_string(),
            child,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("agent is running") as i32
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("killing the agent");
    }

    /// SIGTERM and wait: the graceful stop.
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }

    /// SIGTERM, then waits up to `limit`: the exit status, or `None` if it
    /// is still running.
    pub async fn stop_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()
            .map(|r| r.expect("waiting for the agent"))
    }
}

/// Writes `text` to `path` with mode 0600 (replacing what was there).
pub fn write_private(path: &Path, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A free loopback port (bound then released).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binding port 0");
    l.local_addr().expect("local addr")
}

/// An HTTP client that trusts the CA certificate in `ca` (PEM).
pub fn client_trusting(ca: &Path) -> reqwest::Client {
    let pem = std::fs::read(ca).unwrap_or_else(|e| panic!("reading {}: {e}", ca.display()));
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a PEM certificate"))
        .build()
        .expect("building an HTTP client")
}

/// A server on a fresh database of the shared cluster with a local store.
pub async fn server_on_shared(dir: &Path, lease_ttl_ms: u64) -> Server {
    Server::start(dir, opts_on_shared(dir, lease_ttl_ms).await).await
}

/// [`server_on_shared`]'s options, to change before the start.
pub async fn opts_on_shared(dir: &Path, lease_ttl_ms: u64) -> ServerOpts {
    let pg = crate::pg::shared().await;
    let db = crate::pg::fresh_database(pg).await;
    ServerOpts {
        database_url: pg.database_url(&db),
        store: dir.join("store").to_string_lossy().into_owned(),
        listen: "127.0.0.1:0".parse().expect("valid address"),
        lease_ttl_ms,
        backoff_base_ms: 200,
        env: Vec::new(),
    }
}
