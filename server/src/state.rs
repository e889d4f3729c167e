//! What every handler shares: the pool, the object store, the wake-ups for
//! long-polling agents and for the coordinator, settings, and the shutdown
//! token.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub store: Arc<dyn ObjectStore>,
    /// Woken (all waiters) when jobs may have become claimable: a NOTIFY
    /// from any server instance, or an agent resumed here.
    pub job_signal: Arc<Notify>,
    /// Woken with a parent's id when a child job of it ended here (or a
    /// request changed it), so the coordinator advances it at once
    /// ([`crate::coordinator`]).
    pub parents_signal: Arc<crate::coordinator::ParentWakeups>,
    pub settings: Arc<Settings>,
    pub shutdown: CancellationToken,
    pub auth_cache: Arc<crate::auth::AuthCache>,
    /// Which process of each agent may call ([`crate::agents::Instances`]).
    pub agent_instances: Arc<crate::agents::Instances>,
    /// What the dashboard's live streams compute once and share.
    pub live_pages: Arc<crate::dashboard::shared::LivePages>,
    /// The waiting cap's recent refusals ([`crate::queue::submit::CapRefusals`]).
    pub cap_refusals: Arc<crate::queue::submit::CapRefusals>,
}

impl AppState {
    /// Job `id` ended here other than through its agent (a cancel): the
    /// run it is part of, if any, is looked at now rather than at the
    /// coordinator's next pass over every run. The job has ended whatever
    /// happens here: a failure to find its run is logged, not answered.
    pub async fn wake_parent_of(&self, id: uuid::Uuid) {
        match crate::queue::read::parent(&self.db, id).await {
            Ok(Some(parent)) => self.parents_signal.wake(parent),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "finding a cancelled job's run to wake")
            }
        }
    }

    /// The waiting cap a submission by a token of `role` is held to
    /// (`None`: an admin's, not limited).
    pub fn waiting_cap(
        &self,
        role: flotilla_core::api::TokenRole,
    ) -> Option<crate::queue::submit::WaitingCap<'_>> {
        self.settings
            .waiting_cap(role)
            .map(|limit| crate::queue::submit::WaitingCap {
                limit,
                refusals: &self.cap_refusals,
            })
    }
}

/// Queue timings and HTTP limits. Defaults suit a fleet; tests shorten them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a lease lives without a heartbeat.
    pub lease_ttl: Duration,
    /// Most bytes of log text kept per attempt: its first half and its
    /// last half ([`crate::queue::logs`]).
    pub log_cap_bytes: u64,
    /// What agents are told to heartbeat at (a third of the TTL).
    pub heartbeat_interval: Duration,
    /// How often the reaper looks for expired leases.
    pub reap_interval: Duration,
    /// Fallback poll while a lease request waits (NOTIFY is the fast path).
    pub lease_poll_interval: Duration,
    /// Longest a lease request may wait.
    pub max_lease_wait: Duration,
    /// Retry back-off: base · 2^(attempt−1), capped at `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How often the coordinator advances parents whose children ended on
    /// another server or by the reaper (children that end here wake it at
    /// once).
    pub coordinator_interval: Duration,
    /// Largest accepted JSON body.
    pub max_body_bytes: usize,
    /// Serve the dashboard without a login (a local run only).
    pub dashboard_open: bool,
    /// How requests arrive, so which came over HTTPS (the dashboard's
    /// cookie is `Secure` for those).
    pub transport: crate::transport::Transport,
    /// What HTTP connections may cost ([`crate::connections`]).
    pub http: HttpLimits,
    /// Pool connections only the agent protocol uses, apart from the main
    /// pool (`serve::run` says why).
    pub agent_pool_size: u32,
    /// For an S3 store: agents get a tile's inputs and checkpoint by a
    /// redirect to a presigned URL instead of through the server. `None`:
    /// the server streams them (a local store, or `--presign-ttl-s 0`).
    pub presigner: Option<std::sync::Arc<crate::store::Presigner>>,
    /// When alerts fire ([`crate::alerts`]).
    pub alerts: crate::alerts::AlertSettings,
    /// Agents' health history ([`crate::agent_health`]): at most one
    /// heartbeat's report per agent per `interval` is kept, for `window`.
    pub health_samples: HealthSampling,
    /// How long finished jobs stay in the tables before they are archived
    /// to the object store ([`crate::queue::retention`]).
    pub retention: crate::queue::retention::Retention,
    /// Superseded checkpoints and uploads a crash left behind, removed
    /// ([`crate::store::sweep`]).
    pub sweep: crate::store::sweep::Sweep,
    /// Most jobs one submitter may have waiting to run (queued or
    /// retrying) when it submits more; admins are not limited. `None`: no
    /// limit.
    pub max_waiting_per_submitter: Option<u64>,
    /// The caps on the dashboard's live streams.
    pub live_streams: crate::dashboard::streams::StreamLimits,
}

/// How much of agents' health history is kept.
#[derive(Debug, Clone, Copy)]
pub struct HealthSampling {
    pub interval: Duration,
    pub window: Duration,
}

impl Default for HealthSampling {
    fn default() -> Self {
        HealthSampling {
            // Three heartbeats at the default 10 s: 120 points an hour,
            // 2,880 a day, enough to see a leak or a full disk coming.
            interval: Duration::from_secs(30),
            // A week, to compare today with the same day last week.
            window: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// Limits on HTTP connections and request bodies, so that clients that
/// connect and say nothing, send half a request, or stop reading cannot
/// hold descriptors forever. `None`: no limit (not for production).
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Most connections open at once; past it the server stops accepting.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers, and longest
    /// an idle keep-alive connection is kept (hyper's one timer for both).
    /// Agents call at least every heartbeat (10 s), so their connections
    /// stay open.
    pub header_read_timeout: Option<Duration>,
    /// Longest a response write may make no progress: a client that stopped
    /// reading a stream or a download.
    pub send_stall_timeout: Option<Duration>,
    /// Longest a handler may wait for the next bytes of a request body. A
    /// limit on progress, not on the total, which would cut a legitimate
    /// 64 GiB output upload.
    pub body_stall_timeout: Option<Duration>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            // Far above a fleet's needs (an agent keeps a connection or two,
            // a dashboard tab two), far below a default open-files limit
            // raised to its hard limit (`connections` lowers it if not).
            max_connections: 4096,
            // Hyper's own default, which only applies with a timer.
            header_read_timeout: Some(Duration::from_secs(30)),
            send_stall_timeout: Some(Duration::from_secs(60)),
            body_stall_timeout: Some(Duration::from_secs(60)),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        let lease_ttl = Duration::from_secs(30);
        Settings {
            lease_ttl,
            // Far more than a person reads, far less than fills a disk: a
            // week-long job printing at full speed keeps 64 MiB per attempt.
            log_cap_bytes: 64 << 20,
            heartbeat_interval: lease_ttl / 3,
            reap_interval: Duration::from_secs(2),
            lease_poll_interval: Duration::from_secs(1),
            max_lease_wait: Duration::from_secs(30),
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(300),
            coordinator_interval: Duration::from_millis(500),
            max_body_bytes: 1 << 20,
            dashboard_open: false,
            transport: crate::transport::Transport::Plain,
            http: HttpLimits::default(),
            agent_pool_size: 8,
            presigner: None,
            alerts: crate::alerts::AlertSettings::default(),
            health_samples: HealthSampling::default(),
            retention: crate::queue::retention::Retention::default(),
            sweep: crate::store::sweep::Sweep::default(),
            // Four of the largest ROI a client may submit (250,000 tiles):
            // far past a day of the fleet's work, far short of the millions
            // of rows that would slow every count.
            max_waiting_per_submitter: Some(1_000_000),
            live_streams: crate::dashboard::streams::StreamLimits::default(),
        }
    }
}

impl Settings {
    /// The cap on waiting jobs for a submission by a token of `role`.
    pub fn waiting_cap(&self, role: flotilla_core::api::TokenRole) -> Option<u64> {
        match role {
            flotilla_core::api::TokenRole::Admin => None,
            _ => self.max_waiting_per_submitter,
        }
    }

    /// Settings with the lease TTL given, the rest derived from it.
    pub fn with_lease_ttl(lease_ttl: Duration) -> Self {
        Settings {
            lease_ttl,
            heartbeat_interval: lease_ttl / 3,
            reap_interval: (lease_ttl / 10)
                .clamp(Duration::from_millis(200), Duration::from_secs(2)),
            ..Settings::default()
        }
    }
}
