//! The agent's side of the agent protocol: typed calls, with retries while
//! the server is unreachable (it may be restarting) so that no result is
//! dropped on the floor.

use std::time::Duration;

use flotilla_core::api::{ErrorBody, OutputView};
use flotilla_core::protocol::{
    paths, Complete, Fail, Heartbeat, HeartbeatReply, LeaseRef, LeaseReply, LeaseRequest, LogBatch,
    Register, Registered,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The server answered with an error; retrying will not help.
    #[error("{status} {code}: {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// Could not reach the server (or it answered 5xx).
    #[error("server unreachable: {0}")]
    Unreachable(String),
    #[error("gave up: shutting down")]
    ShuttingDown,
}

impl CallError {
    /// The server said our lease is gone (stale, not ours, or no such job).
    pub fn lease_gone(&self) -> bool {
        matches!(
            self,
            CallError::Refused {
                status: 403 | 404 | 409,
                ..
            }
        )
    }
}

#[derive(Clone)]
pub struct ServerApi {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl ServerApi {
    pub fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        Ok(ServerApi {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()?,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
        })
    }

    async fn once<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(timeout)
            .json(body)
            .send()
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        decode(resp).await
    }

    /// Calls until the server answers (success or a 4xx), backing off while
    /// it is unreachable, until `stop` fires.
    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
        stop: &CancellationToken,
    ) -> Result<T, CallError> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.once(path, body, timeout).await {
                Err(CallError::Unreachable(why)) => {
                    tracing::warn!(%path, %why, "server unreachable; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return Err(CallError::ShuttingDown),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    pub async fn register(
        &self,
        reg: &Register,
        stop: &CancellationToken,
    ) -> Result<Registered, CallError> {
        self.call(paths::REGISTER, reg, Duration::from_secs(30), stop)
            .await
    }

    pub async fn lease(
        &self,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<LeaseReply, CallError> {
        let req = LeaseRequest {
            wait_ms: wait.as_millis() as u64,
        };
        self.call(paths::LEASE, &req, wait + Duration::from_secs(15), stop)
            .await
    }

    /// One try: a missed heartbeat is simply sent again next interval.
    pub async fn heartbeat(&self, hb: &Heartbeat) -> Result<HeartbeatReply, CallError> {
        self.once(paths::HEARTBEAT, hb, Duration::from_secs(10))
            .await
    }

    pub async fn start(
        &self,
        lease: LeaseRef,
        stop: &CancellationToken,
    ) -> Result<serde_json::Value, CallError> {
        self.call(
            &paths::job(lease.job_id, "start"),
            &lease,
            Duration::from_secs(30),
            stop,
        )
        .await
    }

    pub async fn log(
        &self,
        job: Uuid,
        batch: &LogBatch,
        stop: &CancellationToken,
    ) -> Result<serde_json::Value, CallError> {
        self.call(
            &paths::job(job, "log"),
            batch,
            Duration::from_secs(30),
            stop,
        )
        .await
    }

    pub async fn complete(
        &self,
        job: Uuid,
        c: &Complete,
        stop: &CancellationToken,
    ) -> Result<serde_json::Value, CallError> {
        self.call(
            &paths::job(job, "complete"),
            c,
            Duration::from_secs(60),
            stop,
        )
        .await
    }

    pub async fn fail(
        &self,
        job: Uuid,
        f: &Fail,
        stop: &CancellationToken,
    ) -> Result<serde_json::Value, CallError> {
        self.call(&paths::job(job, "fail"), f, Duration::from_secs(60), stop)
            .await
    }

    /// Streams a file to the server as one output of the current attempt.
    /// Not retried here: the caller retries the whole upload.
    pub async fn upload(
        &self,
        lease: LeaseRef,
        name: &str,
        file: &std::path::Path,
    ) -> Result<OutputView, CallError> {
        let f = tokio::fs::File::open(file)
            .await
            .map_err(|e| CallError::Refused {
                status: 0,
                code: "missing_output".into(),
                message: format!("declared output {} cannot be read: {e}", file.display()),
            })?;
        let len = f.metadata().await.map(|m| m.len()).ok();
        let body =
            reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(f, 1 << 20));
        let encoded: String = name
            .split('/')
            .map(url_escape)
            .collect::<Vec<_>>()
            .join("/");
        let mut req = self
            .http
            .put(format!(
                "{}{}?lease={}",
                self.base,
                paths::job(lease.job_id, &format!("outputs/{encoded}")),
                lease.lease_token
            ))
            .bearer_auth(&self.token)
            .body(body);
        if let Some(len) = len {
            req = req.header(reqwest::header::CONTENT_LENGTH, len);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        decode(resp).await
    }
}

impl ServerApi {
    /// Downloads `GET {path}?lease=…` (a tile job's checkpoint or input)
    /// into `dest` through a temporary file renamed into place; returns its
    /// size and sha256.
    pub async fn download(
        &self,
        lease: LeaseRef,
        action: &str,
        dest: &std::path::Path,
    ) -> Result<(u64, String), CallError> {
        use sha2::Digest;
        use tokio::io::AsyncWriteExt;
        let encoded: String = action
            .split('/')
            .map(url_escape)
            .collect::<Vec<_>>()
            .join("/");
        let mut resp = self
            .http
            .get(format!(
                "{}{}?lease={}",
                self.base,
                paths::job(lease.job_id, &encoded),
                lease.lease_token
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(decode::<serde_json::Value>(resp)
                .await
                .err()
                .unwrap_or(CallError::Unreachable("download failed".into())));
        }
        let io = |e: std::io::Error| CallError::Refused {
            status: 0,
            code: "io".into(),
            message: format!("writing {}: {e}", dest.display()),
        };
        let tmp = dest.with_extension(format!("part-{}", uuid::Uuid::new_v4().simple()));
        let mut f = tokio::fs::File::create(&tmp).await.map_err(io)?;
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        loop {
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    let _ = tokio::fs::remove_file(&tmp).await;
                    return Err(CallError::Unreachable(e.to_string()));
                }
            };
            hasher.update(&chunk);
            size += chunk.len() as u64;
            f.write_all(&chunk).await.map_err(io)?;
        }
        f.flush().await.map_err(io)?;
        drop(f);
        tokio::fs::rename(&tmp, dest).await.map_err(io)?;
        Ok((size, hex::encode(hasher.finalize())))
    }
}

fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn decode<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, CallError> {
    let status = resp.status();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| CallError::Unreachable(e.to_string()))?;
    if status.is_server_error() {
        return Err(CallError::Unreachable(format!(
            "{status}: {}",
            String::from_utf8_lossy(&bytes)
        )));
    }
    if !status.is_success() {
        let (code, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => (e.error.code, e.error.message),
            Err(_) => (
                "unknown".into(),
                String::from_utf8_lossy(&bytes).into_owned(),
            ),
        };
        return Err(CallError::Refused {
            status: status.as_u16(),
            code,
            message,
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| CallError::Refused {
        status: status.as_u16(),
        code: "bad_answer".into(),
        message: e.to_string(),
    })
}
