//! The agent's side of the agent protocol: typed calls, retried while the server is unreachable.
//!
//! The server may be restarting; retrying until it answers means no result
//! is dropped on the floor. How long a caller keeps trying is its `stop`
//! token's business; for the calls about a leased job, [`Delivery`] sets it
//! (a budget per call, and an early stop at shutdown).

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_core::api::{ErrorBody, OutputView};
use flotilla_core::protocol::{
    paths, Complete, Fail, Heartbeat, HeartbeatReply, LeaseRef, LeaseReply, LeaseRequest, LogBatch,
    Register, Registered, INSTANCE_HEADER, LEASE_HEADER,
};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::backoff::Backoff;

mod direct_upload;

/// The `code` given to a refusal whose body was not the server's error
/// envelope (a proxy's error page, an empty body).
const UNKNOWN_CODE: &str = "unknown";

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The server answered with an error; retrying will not help.
    #[error("{status} {code}: {message}")]
    Refused {
        status: u16,
        /// The error envelope's `code` (`stale_lease`, `not_found`, …), or
        /// `unknown` when the body was not an envelope.
        code: String,
        message: String,
    },
    /// Could not reach the server (or it answered 5xx).
    #[error("server unreachable: {0}")]
    Unreachable(String),
    /// A local file could not be read or written; the server was not asked
    /// (or its answer could not be stored).
    #[error("{what} {}: {source}", path.display())]
    Local {
        /// "cannot read", "cannot write".
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gave up: shutting down")]
    ShuttingDown,
    /// Retried for the whole of [`Delivery`]'s budget without an answer.
    #[error("gave up after {}s of retries: the server was unreachable or failing", .0.as_secs())]
    OutOfBudget(Duration),
}

impl CallError {
    /// The server said our lease is gone: stale (`stale_lease`), not ours
    /// (`forbidden`), no such job (`not_found`), no such agent (`conflict`:
    /// "call register first"; its leases went with it), or another process
    /// registered under our name (`superseded`; it handed our leases back).
    pub fn lease_gone(&self) -> bool {
        self.refused_as(
            &[
                "stale_lease",
                "forbidden",
                "not_found",
                "conflict",
                "superseded",
            ],
            &[403, 404, 409],
        )
    }

    /// Another process registered under this agent's name after this one:
    /// this process must stop.
    pub fn superseded(&self) -> bool {
        matches!(self, CallError::Refused { code, .. } if code == "superseded")
    }

    /// `register` refused because another process under this name is still
    /// online; it may go silent (a restart), so registering again later can
    /// succeed.
    pub fn name_in_use(&self) -> bool {
        matches!(self, CallError::Refused { status: 409, code, .. } if code == "conflict")
    }

    /// The server refused for a reason a retry will not change: what was
    /// asked for is not there (`not_found`) or the request is wrong
    /// (`invalid`).
    pub fn is_permanent(&self) -> bool {
        self.refused_as(&["not_found", "invalid"], &[404, 422])
    }

    /// The server refused the body as too large (413): a smaller one may
    /// pass.
    pub fn too_large(&self) -> bool {
        matches!(self, CallError::Refused { status: 413, .. })
    }

    /// A refusal with one of `codes`; by status for a body that was not the
    /// error envelope, the statuses being those the codes come with.
    fn refused_as(&self, codes: &[&str], statuses: &[u16]) -> bool {
        match self {
            CallError::Refused { status, code, .. } if code == UNKNOWN_CODE => {
                statuses.contains(status)
            }
            CallError::Refused { code, .. } => codes.contains(&code.as_str()),
            _ => false,
        }
    }
}

/// How long the calls about one leased job (its start, log and report) are
/// retried while the server is unreachable or answers 5xx: each for at most
/// `budget`, and none once `give_up` fires. A call that runs out of budget
/// says so ([`CallError::OutOfBudget`]) and whoever made it calls
/// [`Delivery::abandon`]: the agent then drops the lease (it stops
/// heartbeating it), so the server's reaper requeues the job instead of the
/// job staying `running` while a report that can never pass is retried.
#[derive(Debug, Clone)]
pub struct Delivery {
    give_up: CancellationToken,
    budget: Duration,
    abandon: CancellationToken,
}

impl Delivery {
    pub fn new(give_up: CancellationToken, budget: Duration) -> Self {
        Delivery {
            give_up,
            budget,
            abandon: CancellationToken::new(),
        }
    }

    /// Runs `call`, which retries until the token it is given fires, for at
    /// most the budget.
    pub async fn retry<T, F, Fut>(&self, call: F) -> Result<T, CallError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        let stop = self.give_up.child_token();
        let call = call(stop.clone());
        tokio::pin!(call);
        let result = tokio::select! {
            r = &mut call => return r,
            _ = tokio::time::sleep(self.budget) => {
                stop.cancel();
                // Ends at once between tries, else when the try in flight
                // times out.
                call.await
            }
        };
        match result {
            Err(CallError::ShuttingDown) if !self.give_up.is_cancelled() => {
                Err(CallError::OutOfBudget(self.budget))
            }
            r => r,
        }
    }

    /// The longest one call is retried.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Says that a delivery about the job ran out of budget: the agent
    /// stops the job and drops its lease.
    pub fn abandon(&self) {
        self.abandon.cancel();
    }

    /// Completes when [`Delivery::abandon`] was called.
    pub async fn abandoned(&self) {
        self.abandon.cancelled().await
    }
}

/// A call about one leased job, with its body.
#[derive(Debug, Clone, Copy)]
pub enum JobCall<'a> {
    /// `POST jobs/{id}/start`: the job is running.
    Start(&'a LeaseRef),
    /// `POST jobs/{id}/log`: lines for the job's log.
    Log(&'a LogBatch),
    /// `POST jobs/{id}/complete`.
    Complete(&'a Complete),
    /// `POST jobs/{id}/fail`.
    Fail(&'a Fail),
}

impl JobCall<'_> {
    fn action(&self) -> &'static str {
        match self {
            JobCall::Start(_) => "start",
            JobCall::Log(_) => "log",
            JobCall::Complete(_) => "complete",
            JobCall::Fail(_) => "fail",
        }
    }

    /// Per try. A completion can take longer than the rest: for a tile job
    /// the server copies the outputs to their final keys before answering.
    fn timeout(&self) -> Duration {
        match self {
            JobCall::Start(_) | JobCall::Log(_) => Duration::from_secs(30),
            JobCall::Complete(_) | JobCall::Fail(_) => Duration::from_secs(60),
        }
    }
}

/// How long a file transfer (a download, an output upload) may take. A
/// transfer that stalls fails instead of holding its job, and whatever it
/// holds, for as long as the connection stays open.
#[derive(Debug, Clone, Copy)]
pub struct TransferLimits {
    /// Longest wait for the answer's headers and then for each further
    /// piece of the body (a download), or for the server to take more of
    /// the body (an upload). A minute: the server answers within
    /// milliseconds when it is well, and a store read or a TCP
    /// retransmission takes seconds at worst.
    pub stall: Duration,
    /// The whole transfer may take `base` plus its size at `min_rate`
    /// bytes a second: a slow but moving connection still finishes, one
    /// that trickles a byte a minute does not.
    pub base: Duration,
    pub min_rate: u64,
}

impl Default for TransferLimits {
    fn default() -> Self {
        TransferLimits {
            stall: Duration::from_secs(60),
            base: Duration::from_secs(600),
            // 1 MiB/s: a tile's 1.5 GB of inputs within 35 minutes.
            min_rate: 1 << 20,
        }
    }
}

impl TransferLimits {
    /// The longest a transfer of `len` bytes may take (of an unknown size:
    /// as for 16 GiB).
    fn total(&self, len: Option<u64>) -> Duration {
        let len = len.unwrap_or(16 << 30);
        self.base + Duration::from_secs(len / self.min_rate.max(1))
    }
}

/// The servers an agent may talk to (replicas on one database, any of
/// which answers every call the same), and the one it talks to now: it
/// stays with one until that one stops answering, then tries the next in
/// turn. Shared by every clone of the client, so a job's calls move with
/// the agent's.
struct Servers {
    urls: Vec<String>,
    current: std::sync::atomic::AtomicUsize,
}

impl Servers {
    fn current(&self) -> (usize, &str) {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed) % self.urls.len();
        (i, &self.urls[i])
    }

    /// `urls[failed]` did not answer: the next server, unless another call
    /// has moved on already.
    fn failed(&self, failed: usize) {
        if self.urls.len() > 1 {
            let next = (failed + 1) % self.urls.len();
            if self
                .current
                .compare_exchange(
                    failed,
                    next,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
            {
                tracing::warn!(
                    from = %self.urls[failed],
                    to = %self.urls[next],
                    "server not answering; trying the next one"
                );
            }
        }
    }
}

#[derive(Clone)]
pub struct ServerApi {
    http: reqwest::Client,
    servers: std::sync::Arc<Servers>,
    token: String,
    /// This process's [`Register::instance`], sent on every call.
    instance: Uuid,
    transfer: TransferLimits,
    /// For the object store's presigned URLs: none of the server's
    /// headers (token, instance), which are no business of the store's.
    store: reqwest::Client,
}

impl ServerApi {
    /// A client for one agent process: a fresh instance id, sent in
    /// [`INSTANCE_HEADER`] on every request.
    pub fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        Self::trusting(base, token, Vec::new())
    }

    /// [`ServerApi::new`] that trusts `roots` (the CAs of `--ca-file`)
    /// besides the public roots.
    pub fn trusting(
        base: &str,
        token: &str,
        roots: Vec<reqwest::Certificate>,
    ) -> anyhow::Result<Self> {
        Self::trusting_any(&[base.to_string()], token, roots)
    }

    /// [`ServerApi::trusting`] over several servers (replicas on one
    /// database): calls go to the first until it stops answering, then to
    /// the next in turn (see [`Servers`]).
    pub fn trusting_any(
        bases: &[String],
        token: &str,
        roots: Vec<reqwest::Certificate>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!bases.is_empty(), "no server URL given");
        let instance = Uuid::new_v4();
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            INSTANCE_HEADER,
            reqwest::header::HeaderValue::from_str(&instance.to_string())
                .expect("a uuid is a valid header value"),
        );
        let mut http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            // The server redirects only a download to its store, which
            // `download` follows itself without the server's headers.
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(headers);
        let mut store = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
        for root in roots {
            http = http.add_root_certificate(root.clone());
            store = store.add_root_certificate(root);
        }
        Ok(ServerApi {
            http: http.build()?,
            store: store.build()?,
            servers: std::sync::Arc::new(Servers {
                urls: bases
                    .iter()
                    .map(|b| b.trim_end_matches('/').to_string())
                    .collect(),
                current: std::sync::atomic::AtomicUsize::new(0),
            }),
            token: token.to_string(),
            instance,
            transfer: TransferLimits::default(),
        })
    }

    /// The same client with other limits on downloads and uploads.
    pub fn with_transfer_limits(mut self, limits: TransferLimits) -> Self {
        self.transfer = limits;
        self
    }

    /// This process's instance id, for [`Register::instance`].
    pub fn instance(&self) -> Uuid {
        self.instance
    }

    async fn once<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let (server, base) = self.servers.current();
        let resp = self
            .http
            .post(format!("{base}{path}"))
            .bearer_auth(&self.token)
            .timeout(timeout)
            .json(body)
            .send()
            .await
            // Every cause, and what to do about a TLS failure.
            .map_err(|e| {
                self.servers.failed(server);
                CallError::Unreachable(flotilla_core::tls::explain(&e, base))
            })?;
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
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match self.once(path, body, timeout).await {
                Err(CallError::Unreachable(why)) => {
                    tracing::warn!(%path, %why, "server unreachable; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return Err(CallError::ShuttingDown),
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
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
        // One id for this request, sent again with each retry of it: a
        // server that leased a job but whose answer was lost answers that
        // lease again rather than leasing another.
        let req = LeaseRequest {
            wait_ms: wait.as_millis() as u64,
            request: Some(Uuid::new_v4()),
        };
        self.call(paths::LEASE, &req, wait + Duration::from_secs(15), stop)
            .await
    }

    /// One try: a missed heartbeat is simply sent again next interval.
    pub async fn heartbeat(&self, hb: &Heartbeat) -> Result<HeartbeatReply, CallError> {
        self.once(paths::HEARTBEAT, hb, Duration::from_secs(10))
            .await
    }

    /// One call about a leased job, retried while the server is
    /// unreachable until `stop` fires. The reply carries nothing the agent
    /// uses.
    pub async fn job_call(
        &self,
        job: Uuid,
        call: JobCall<'_>,
        stop: &CancellationToken,
    ) -> Result<(), CallError> {
        let path = paths::job(job, call.action());
        let timeout = call.timeout();
        let _: IgnoredAny = match call {
            JobCall::Start(b) => self.call(&path, b, timeout, stop).await?,
            JobCall::Log(b) => self.call(&path, b, timeout, stop).await?,
            JobCall::Complete(b) => self.call(&path, b, timeout, stop).await?,
            JobCall::Fail(b) => self.call(&path, b, timeout, stop).await?,
        };
        Ok(())
    }

    /// Stores a file as one output of the current attempt: straight to the
    /// object store where the server offers that (an S3 store; see
    /// [`direct_upload`]), else streamed to the server. Not retried here,
    /// but for the parts of a direct upload: the caller retries the whole
    /// upload. Fails when the receiver takes nothing more for
    /// [`TransferLimits::stall`] or the whole takes longer than
    /// [`TransferLimits::total`].
    pub async fn upload(
        &self,
        lease: LeaseRef,
        name: &str,
        file: &Path,
    ) -> Result<OutputView, CallError> {
        let len = tokio::fs::metadata(file)
            .await
            .map_err(|source| CallError::Local {
                what: "cannot read",
                path: file.to_path_buf(),
                source,
            })?
            .len();
        match self.direct_terms(lease, name, len).await? {
            Some(part_size) => self.upload_direct(lease, name, file, len, part_size).await,
            None => self.upload_through_server(lease, name, file).await,
        }
    }

    /// [`ServerApi::upload`], tried again while no server answers (a
    /// replica restarting, or the next in the list taking over: the output
    /// is on disk, and an upload of it replaces any partial one), backing
    /// off, until `stop` fires or `budget` has passed. Without this a
    /// server killed during an upload failed the attempt and the job ran
    /// again (the chaos run found it).
    pub async fn upload_retrying(
        &self,
        lease: LeaseRef,
        name: &str,
        file: &Path,
        stop: &CancellationToken,
        budget: Duration,
    ) -> Result<OutputView, CallError> {
        while_unreachable(stop, budget, name, || self.upload(lease, name, file)).await
    }

    /// Streams a file to the server, which stores it.
    async fn upload_through_server(
        &self,
        lease: LeaseRef,
        name: &str,
        file: &Path,
    ) -> Result<OutputView, CallError> {
        let f = tokio::fs::File::open(file)
            .await
            .map_err(|source| CallError::Local {
                what: "cannot read",
                path: file.to_path_buf(),
                source,
            })?;
        let len = f.metadata().await.map(|m| m.len()).ok();
        let started = tokio::time::Instant::now();
        let deadline = started + self.transfer.total(len);
        let (body, progress) = watched_body(f);
        let encoded: String = name
            .split('/')
            .map(url_escape)
            .collect::<Vec<_>>()
            .join("/");
        let (server, base) = self.servers.current();
        let mut req = self
            .http
            .put(format!(
                "{}{}",
                base,
                paths::job(lease.job_id, &format!("outputs/{encoded}"))
            ))
            .bearer_auth(&self.token)
            .header(LEASE_HEADER, lease.lease_token.to_string())
            .body(body);
        if let Some(len) = len {
            req = req.header(reqwest::header::CONTENT_LENGTH, len);
        }
        let send = async {
            let resp = req.send().await.map_err(|e| {
                self.servers.failed(server);
                CallError::Unreachable(e.to_string())
            })?;
            decode(resp).await
        };
        let watch = Watch {
            what: format!("uploading {name}"),
            peer: "the server",
            len,
            started,
            deadline,
        };
        self.watched(send, &progress, &watch).await
    }

    /// Awaits `send`, a request whose body reports to `progress`: fails
    /// when the body makes no progress for [`TransferLimits::stall`]
    /// while some of it is unsent, or at the deadline.
    async fn watched<T>(
        &self,
        send: impl std::future::Future<Output = Result<T, CallError>>,
        progress: &BodyProgress,
        watch: &Watch,
    ) -> Result<T, CallError> {
        tokio::pin!(send);
        loop {
            let (last, sent) = progress.get();
            let all_sent = watch.len.is_some_and(|len| sent >= len);
            let wake = if all_sent {
                watch.deadline
            } else {
                (last + self.transfer.stall).min(watch.deadline)
            };
            tokio::select! {
                r = &mut send => return r,
                _ = tokio::time::sleep_until(wake) => {}
            }
            let now = tokio::time::Instant::now();
            if now >= watch.deadline {
                return Err(CallError::Unreachable(format!(
                    "{}: took longer than {}s",
                    watch.what,
                    (watch.deadline - watch.started).as_secs()
                )));
            }
            let (last, sent) = progress.get();
            if watch.len.is_none_or(|len| sent < len) && now >= last + self.transfer.stall {
                return Err(CallError::Unreachable(format!(
                    "{}: stalled, {} took nothing for {}s",
                    watch.what,
                    watch.peer,
                    self.transfer.stall.as_secs()
                )));
            }
        }
    }
}

/// What a watched upload is, for [`ServerApi::watched`] and its errors.
struct Watch {
    /// "uploading out.bin", "uploading out.bin: part 2 of 3".
    what: String,
    /// Who takes the body: "the server", "the store".
    peer: &'static str,
    /// Of the body, where known.
    len: Option<u64>,
    started: tokio::time::Instant,
    deadline: tokio::time::Instant,
}

/// When an upload's body last had a piece taken, and how much so far;
/// once it is all taken, only the deadline applies while the receiver
/// stores it.
#[derive(Clone)]
struct BodyProgress(std::sync::Arc<std::sync::Mutex<(tokio::time::Instant, u64)>>);

impl BodyProgress {
    fn get(&self) -> (tokio::time::Instant, u64) {
        *self.0.lock().expect("progress lock is never poisoned")
    }
}

/// A request body read from `reader` in 1 MiB pieces, and its progress.
fn watched_body<R>(reader: R) -> (reqwest::Body, BodyProgress)
where
    R: tokio::io::AsyncRead + Send + 'static,
{
    use futures::StreamExt;
    let progress = BodyProgress(std::sync::Arc::new(std::sync::Mutex::new((
        tokio::time::Instant::now(),
        0u64,
    ))));
    let stream = {
        let progress = progress.clone();
        tokio_util::io::ReaderStream::with_capacity(reader, 1 << 20).inspect(move |chunk| {
            if let Ok(c) = chunk {
                let mut p = progress.0.lock().expect("progress lock is never poisoned");
                *p = (tokio::time::Instant::now(), p.1 + c.len() as u64);
            }
        })
    };
    (reqwest::Body::wrap_stream(stream), progress)
}

impl ServerApi {
    /// Downloads `GET {path}` (a tile job's checkpoint or input, the lease
    /// token in [`LEASE_HEADER`])
    /// into `dest` through a temporary file renamed into place; returns its
    /// size and sha256. Fails when nothing arrives for
    /// [`TransferLimits::stall`] or the whole takes longer than
    /// [`TransferLimits::total`]; the temporary file is removed however
    /// the download ends, the future dropped included.
    pub async fn download(
        &self,
        lease: LeaseRef,
        action: &str,
        dest: &Path,
    ) -> Result<(u64, String), CallError> {
        use sha2::Digest;
        use tokio::io::AsyncWriteExt;
        let started = tokio::time::Instant::now();
        let stall = self.transfer.stall;
        let stalled = |what: &str| {
            CallError::Unreachable(format!(
                "downloading {action}: stalled, {what} for {}s",
                stall.as_secs()
            ))
        };
        let encoded: String = action
            .split('/')
            .map(url_escape)
            .collect::<Vec<_>>()
            .join("/");
        let (server, base) = self.servers.current();
        let request = self
            .http
            .get(format!("{}{}", base, paths::job(lease.job_id, &encoded)))
            .bearer_auth(&self.token)
            .header(LEASE_HEADER, lease.lease_token.to_string())
            .send();
        let mut resp = tokio::time::timeout(stall, request)
            .await
            .map_err(|_| stalled("no answer"))?
            .map_err(|e| {
                self.servers.failed(server);
                CallError::Unreachable(e.to_string())
            })?;
        // An S3 store's presigned URL: fetched with the store's client, so
        // neither the server's token nor the lease token goes with it (the
        // server's client follows no redirects).
        if resp.status().is_redirection() {
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| resp.url().join(v).ok())
                .ok_or_else(|| {
                    CallError::Unreachable(format!(
                        "downloading {action}: a redirect ({}) without a usable Location",
                        resp.status()
                    ))
                })?;
            resp = tokio::time::timeout(stall, self.store.get(to).send())
                .await
                .map_err(|_| stalled("no answer from the store"))?
                .map_err(|e| {
                    // Not the URL: it carries the presigned signature.
                    CallError::Unreachable(format!(
                        "downloading {action} from the store: {}",
                        e.without_url()
                    ))
                })?;
        }
        if !resp.status().is_success() {
            return Err(decode::<IgnoredAny>(resp)
                .await
                .err()
                .unwrap_or(CallError::Unreachable("download failed".into())));
        }
        let deadline = started + self.transfer.total(resp.content_length());
        let io = |source| CallError::Local {
            what: "cannot write",
            path: dest.to_path_buf(),
            source,
        };
        let part = PartFile(Some(
            dest.with_extension(format!("part-{}", uuid::Uuid::new_v4().simple())),
        ));
        let mut f = tokio::fs::File::create(part.path()).await.map_err(io)?;
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        loop {
            let wake = (tokio::time::Instant::now() + stall).min(deadline);
            let chunk = match tokio::time::timeout_at(wake, resp.chunk()).await {
                Ok(Ok(Some(c))) => c,
                Ok(Ok(None)) => break,
                // Not the URL: a store's is presigned.
                Ok(Err(e)) => {
                    return Err(CallError::Unreachable(format!(
                        "downloading {action}: {}",
                        e.without_url()
                    )))
                }
                Err(_) if wake >= deadline => {
                    return Err(CallError::Unreachable(format!(
                        "downloading {action}: took longer than {}s",
                        (deadline - started).as_secs()
                    )))
                }
                Err(_) => return Err(stalled(&format!("no data after {size} bytes"))),
            };
            hasher.update(&chunk);
            size += chunk.len() as u64;
            f.write_all(&chunk).await.map_err(io)?;
        }
        f.flush().await.map_err(io)?;
        drop(f);
        tokio::fs::rename(part.path(), dest).await.map_err(io)?;
        part.kept();
        Ok((size, hex::encode(hasher.finalize())))
    }
}

/// A download's temporary file, removed when dropped (an error, a timeout,
/// the job stopped and its future dropped); forgotten once renamed into
/// place.
struct PartFile(Option<PathBuf>);

impl PartFile {
    fn path(&self) -> &Path {
        self.0
            .as_deref()
            .expect("a part file is only kept when it goes")
    }

    /// Renamed into place: nothing to remove.
    fn kept(mut self) {
        self.0 = None;
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
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

/// Runs `call` again while it fails with [`CallError::Unreachable`],
/// backing off, until `stop` fires ([`CallError::ShuttingDown`]) or `budget`
/// has passed (the last error). For transfers of files the agent holds,
/// which a new try makes again from the start.
pub(crate) async fn while_unreachable<T, F, Fut>(
    stop: &CancellationToken,
    budget: Duration,
    what: &str,
    mut call: F,
) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CallError>>,
{
    let deadline = tokio::time::Instant::now() + budget;
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        match call().await {
            Err(CallError::Unreachable(why)) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(%what, %why, "transfer failed; trying again");
                tokio::select! {
                    _ = stop.cancelled() => return Err(CallError::ShuttingDown),
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
            other => return other,
        }
    }
}

async fn decode<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, CallError> {
    let status = resp.status();
    // The server redirects nothing but a download (which `download`
    // follows itself): a redirect here is a proxy's, say http to https.
    if status.is_redirection() {
        let to = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("nowhere");
        return Err(CallError::Refused {
            status: status.as_u16(),
            code: UNKNOWN_CODE.into(),
            message: format!(
                "the server's address answered with a redirect ({status}) to {to}: give the \
                 agent the address it redirects to (--server)"
            ),
        });
    }
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
                UNKNOWN_CODE.into(),
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
