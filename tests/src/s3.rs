//! A real S3-compatible server for the tests, moto's (from PyPI; Debian
//! has none), on a free loopback port with a bucket made; and
//! [`CopyGate`], a pass-through proxy in front of it that can hold the
//! store copies a server makes, so that a test sees what the server does
//! while a copy takes long (as one of a large object does on S3).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::eventually;
use crate::procs::free_addr;

/// A moto server; killed when dropped.
pub struct Moto {
    _child: tokio::process::Child,
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

fn moto_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import moto.server"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Moto {
    /// Starts moto and makes `bucket`. `None` (the test skips, saying so)
    /// where moto is not installed; under CI, which installs it
    /// (`scripts/setup-debian.sh --test`), its absence fails the test.
    pub async fn start(bucket: &str) -> Option<Moto> {
        if !moto_available() {
            assert!(
                std::env::var_os("CI").is_none(),
                "moto[server] is not installed; scripts/setup-debian.sh --test installs it"
            );
            eprintln!(
                "SKIPPED: moto[server] is not installed (run scripts/setup-debian.sh --test)"
            );
            return None;
        }
        let addr = free_addr();
        let child = tokio::process::Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
            .arg(addr.port().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starting moto");
        let endpoint = format!("http://{addr}");
        let http = reqwest::Client::new();
        let url = format!("{endpoint}/{bucket}");
        eventually("moto to answer", Duration::from_secs(60), || {
            let req = http.put(&url).send();
            async move { matches!(req.await, Ok(r) if r.status().is_success()) }
        })
        .await;
        Some(Moto {
            _child: child,
            addr,
            endpoint,
        })
    }

    /// Puts every file of `dir` into the store at `prefix` (`bucket/key
    /// prefix`), named as it is there.
    pub async fn put_files(&self, prefix: &str, dir: &std::path::Path) {
        let http = reqwest::Client::new();
        for f in std::fs::read_dir(dir).expect("reading the directory") {
            let f = f.expect("a directory entry");
            let name = f.file_name().to_string_lossy().into_owned();
            let url = format!("{}/{prefix}/{name}", self.endpoint);
            let r = http
                .put(&url)
                .body(std::fs::read(f.path()).expect("reading a file"))
                .send()
                .await
                .expect("a PUT to moto");
            assert!(r.status().is_success(), "PUT {url}: {}", r.status());
        }
    }

    /// A server's environment for a store at `endpoint` (moto's own, or a
    /// proxy in front of it).
    pub fn server_env(endpoint: &str) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ALLOW_HTTP", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// A TCP proxy to an S3 server that passes everything through, except that
/// while it is closed it holds each request carrying `x-amz-copy-source`
/// (an S3 CopyObject) until it is opened. Plain HTTP on loopback, where a
/// request head arrives in one read.
pub struct CopyGate {
    /// `http://127.0.0.1:PORT`: give this to the server as its endpoint.
    pub endpoint: String,
    open: watch::Sender<bool>,
    held: watch::Receiver<u64>,
}

impl CopyGate {
    /// A gate in front of `upstream`, open.
    pub async fn start(upstream: SocketAddr) -> CopyGate {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
        let (open, open_rx) = watch::channel(true);
        let (held_tx, held) = watch::channel(0u64);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(store) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(pass(client, store, open_rx.clone(), held_tx.clone()));
            }
        });
        CopyGate {
            endpoint,
            open,
            held,
        }
    }

    /// Holds copies from now on.
    pub fn close(&self) {
        self.open.send_replace(false);
    }

    /// Lets held copies and later ones through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Waits until a copy is being held (one more than `seen` so far);
    /// returns how many have been.
    pub async fn copy_held(&mut self, seen: u64) -> u64 {
        let n = self
            .held
            .wait_for(|n| *n > seen)
            .await
            .expect("the gate is running");
        *n
    }
}

/// One connection: the client's bytes to the store (a copy held while the
/// gate is closed), the store's back as they come.
async fn pass(
    client: TcpStream,
    store: TcpStream,
    mut open: watch::Receiver<bool>,
    held: watch::Sender<u64>,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_store, mut to_store) = store.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_store, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from_client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let is_copy = chunk
            .to_ascii_lowercase()
            .windows(b"x-amz-copy-source".len())
            .any(|w| w == b"x-amz-copy-source");
        if is_copy && !*open.borrow() {
            held.send_modify(|n| *n += 1);
            if open.wait_for(|o| *o).await.is_err() {
                break;
            }
        }
        if to_store.write_all(chunk).await.is_err() {
            break;
        }
    }
    let _ = to_store.shutdown().await;
    let _ = back.await;
}
