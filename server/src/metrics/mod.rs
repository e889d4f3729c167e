//! `GET /metrics`: the Prometheus text exposition, built at each scrape
//! from what the tables say then (so any server instance answers the same),
//! plus this process's own readings and HTTP latencies.
//!
//! - [`jobs`]: jobs by kind and state, the ready ones.
//! - [`totals`]: counters and histograms that only go up (attempts by
//!   outcome, run time, lease wait), kept by triggers.
//! - [`process`]: open descriptors, memory, CPU of this server process.
//! - [`http`]: the request-latency middleware.
//! - alerts: `flotilla_alert{alert,severity,subject}` per active alert
//!   ([`crate::alerts::export`]), the list the dashboard shows.
//!
//! Agents' series carry `{agent}` alone (their operator state is its own
//! gauge, `flotilla_agent_state{agent,state}`), so pausing an agent does not
//! start new series; every kind × state, kind × outcome and agent × state is
//! exported, zeros included. A metric whose value is unknown (an agent on a
//! platform that does not report its descriptors) is left out rather than
//! given a made-up value.

pub mod http;
pub mod jobs;
pub mod process;
pub mod totals;

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Extension;
use flotilla_core::api::tiles::AgentTileRate;
use flotilla_core::api::{AgentState, AgentView};
use flotilla_core::health::HostHealth;
use flotilla_core::job::{JobKind, JobState};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet,
    NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::auth::MetricsAuth;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub use http::HttpLatency;

/// How an attempt can end (`job_attempts.outcome`, set by queue/lease.rs
/// and queue/reaper.rs): each is exported for every kind, zeros included.
const OUTCOMES: [&str; 6] = [
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
    "lease_expired",
    "interrupted",
];

const AGENT_STATES: [AgentState; 4] = [
    AgentState::Active,
    AgentState::Paused,
    AgentState::Draining,
    AgentState::Drained,
];

pub async fn metrics(
    State(state): State<AppState>,
    MetricsAuth(_): MetricsAuth,
    latency: Option<Extension<HttpLatency>>,
) -> ApiResult<impl IntoResponse> {
    totals::fold(&state.db).await?;
    let scrape = Scrape {
        jobs: jobs::read(&state.db).await?,
        totals: totals::read(&state.db).await?,
        agents: crate::agents::list(&state.db, state.settings.heartbeat_interval).await?,
        tiles: crate::tiles::stats::rates(&state.db)
            .await?
            .into_iter()
            .map(|r| (r.agent.clone(), r))
            .collect(),
        process: process::Process::read(),
        alerts: crate::alerts::current(&state).await?,
        streams: state.live_pages.streams.counts(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    if let Some(Extension(latency)) = latency {
        latency.register(&mut registry);
    }
    let mut body = String::new();
    prometheus_text::encode(&mut body, &registry)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("encoding the metrics: {e}")))?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            prometheus_text::CONTENT_TYPE,
        )],
        body,
    ))
}

/// What one scrape read; encoded once, then dropped.
#[derive(Debug)]
struct Scrape {
    jobs: jobs::JobCounts,
    totals: totals::Totals,
    agents: Vec<AgentView>,
    /// By agent name.
    tiles: BTreeMap<String, AgentTileRate>,
    process: process::Process,
    alerts: std::sync::Arc<flotilla_core::api::alerts::AlertList>,
    /// The dashboard's live streams open in this process, and how many
    /// were refused by its caps since it started.
    streams: (usize, u64),
}

/// A gauge read from an agent's latest health report: name, help, unit and
/// the reading (`None` when the report does not say).
type HealthGauge = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&HostHealth) -> Option<f64>,
);

/// The label set of a family with one unlabelled sample.
const NO_LABELS: [(&str, &str); 0] = [];

/// The text encoder's one error type: a failed write into the body.
type Fmt = Result<(), std::fmt::Error>;

/// A family of gauges: one descriptor, then one sample per label set.
fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (L, V)>,
) -> Fmt {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in samples {
        family.encode_family(&labels)?.encode_gauge(&v)?;
    }
    Ok(())
}

/// A family of counters; `name` without `_total`, which the encoder adds.
fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (L, V)>,
) -> Fmt {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in samples {
        family
            .encode_family(&labels)?
            .encode_counter::<NoLabelSet, V, f64>(&v, None)?;
    }
    Ok(())
}

/// A family of histograms read from the totals.
fn histograms<'h, L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    bounds: &[f64],
    samples: impl IntoIterator<Item = (L, &'h totals::Hist)>,
) -> Fmt {
    let mut family =
        enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    for (labels, h) in samples {
        family
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(h.sum, h.count(), &h.buckets(bounds), None)?;
    }
    Ok(())
}

/// A family with no labels and one sample, if the value is known.
fn single_gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: Option<V>,
) -> Fmt {
    match v {
        Some(v) => gauges(enc, name, help, unit, [(NO_LABELS, v)]),
        None => Ok(()),
    }
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Fmt {
        gauges(
            &mut enc,
            "flotilla_build_info",
            "1, labelled with this server's version and the newest database migration it knows (schema).",
            None,
            [(
                [
                    ("version", env!("CARGO_PKG_VERSION").to_owned()),
                    ("schema", crate::serve::schema_version().to_string()),
                ],
                1,
            )],
        )?;
        self.encode_jobs(&mut enc)?;
        self.encode_agents(&mut enc)?;
        crate::alerts::export::encode(&self.alerts, &mut enc)?;
        let (open, refused) = self.streams;
        single_gauge(
            &mut enc,
            "flotilla_dashboard_streams",
            "Live dashboard views (event streams) open in this server process.",
            None,
            Some(open as i64),
        )?;
        counters(
            &mut enc,
            "flotilla_dashboard_streams_refused",
            "Live dashboard views this server process refused (--max-streams, --max-streams-per-token) since it started.",
            None,
            [(NO_LABELS, refused)],
        )?;
        self.encode_process(&mut enc)
    }
}

impl Scrape {
    fn encode_jobs(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let kinds = kinds_seen(&self.jobs, &self.totals);
        let mut by_state: BTreeMap<(String, String), i64> = kinds
            .iter()
            .flat_map(|k| JobState::ALL.map(|s| ((k.clone(), s.as_str().to_owned()), 0)))
            .collect();
        by_state.extend(self.jobs.by_state.clone());
        gauges(
            enc,
            "flotilla_jobs",
            "Jobs by kind and state.",
            None,
            by_state
                .iter()
                .map(|((k, s), n)| ([("kind", k.as_str()), ("state", s.as_str())], *n)),
        )?;
        gauges(
            enc,
            "flotilla_jobs_ready",
            "Jobs queued or retrying whose back-off is over and that a registered agent could take: what a fitting agent with room takes now.",
            None,
            by_kind(&kinds, &self.jobs.ready),
        )?;
        gauges(
            enc,
            "flotilla_queue_oldest_ready",
            "How long the longest-waiting ready job of the kind has been ready (jobs no registered agent could take left out); 0 when none is.",
            Some(&Unit::Seconds),
            by_kind(&kinds, &self.jobs.oldest_ready_seconds),
        )?;
        gauges(
            enc,
            "flotilla_jobs_unmatchable",
            "Jobs waiting to run that no registered agent could take: no agent offers their kind, labels or slots.",
            None,
            by_kind(&kinds, &self.jobs.unmatchable),
        )?;
        let mut attempts: BTreeMap<(String, String), u64> = kinds
            .iter()
            .flat_map(|k| OUTCOMES.map(|o| ((k.clone(), o.to_owned()), 0)))
            .collect();
        attempts.extend(self.totals.attempts.clone());
        counters(
            enc,
            "flotilla_job_attempts",
            "Attempts that ended, by kind and outcome.",
            None,
            attempts
                .iter()
                .map(|((k, o), n)| ([("kind", k.as_str()), ("outcome", o.as_str())], *n)),
        )?;
        gauges(
            enc,
            "flotilla_job_attempts_in_progress",
            "Attempts under way (jobs leased or running), by kind.",
            None,
            kinds.iter().map(|k| {
                let n: i64 = ["leased", "running"]
                    .iter()
                    .filter_map(|s| self.jobs.by_state.get(&(k.clone(), (*s).to_owned())))
                    .sum();
                ([("kind", k.as_str())], n)
            }),
        )?;
        // Every kind an agent runs gets its series, empty until it runs one.
        let mut duration: BTreeMap<(String, String), totals::Hist> = self
            .agents
            .iter()
            .flat_map(|a| {
                a.kinds.iter().map(|k| {
                    (
                        (k.as_str().to_owned(), a.name.clone()),
                        totals::Hist::empty(&totals::DURATION_BUCKETS),
                    )
                })
            })
            .collect();
        duration.extend(self.totals.duration.clone());
        histograms(
            enc,
            "flotilla_job_duration",
            "Run time (started to finished) of succeeded attempts, by kind and agent.",
            &totals::DURATION_BUCKETS,
            duration
                .iter()
                .map(|((k, a), h)| ([("kind", k.as_str()), ("agent", a.as_str())], h)),
        )?;
        let empty = totals::Hist::empty(&totals::LEASE_WAIT_BUCKETS);
        histograms(
            enc,
            "flotilla_job_lease_wait",
            "Time from a job being ready (submitted, or its retry's back-off over) to its lease, by kind; its count is the leases made.",
            &totals::LEASE_WAIT_BUCKETS,
            kinds.iter().map(|k| {
                let h = self.totals.lease_wait.get(k).unwrap_or(&empty);
                ([("kind", k.as_str())], h)
            }),
        )
    }

    fn encode_agents(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let agents = &self.agents;
        let label = |a: &AgentView| [("agent", a.name.clone())];
        gauges(
            enc,
            "flotilla_agent_up",
            "1 if the agent has heartbeated within three intervals.",
            None,
            agents.iter().map(|a| (label(a), i64::from(a.online))),
        )?;
        gauges(
            enc,
            "flotilla_agent_info",
            "1, labelled with the agent's version and its tile encoder's backend (empty: none).",
            None,
            agents.iter().map(|a| {
                (
                    [
                        ("agent", a.name.clone()),
                        ("version", a.version.clone()),
                        ("encoder", a.encoder_backend().unwrap_or("").to_owned()),
                    ],
                    1,
                )
            }),
        )?;
        gauges(
            enc,
            "flotilla_agent_state",
            "1 for the agent's operator state (active, paused, draining, drained), 0 for the others.",
            None,
            agents.iter().flat_map(|a| {
                AGENT_STATES.map(|s| {
                    (
                        [("agent", a.name.clone()), ("state", s.as_str().to_owned())],
                        i64::from(a.state == s),
                    )
                })
            }),
        )?;
        gauges(
            enc,
            "flotilla_agent_last_seen_timestamp",
            "When the agent last called, in seconds since the epoch.",
            Some(&Unit::Seconds),
            agents.iter().filter_map(|a| {
                a.last_seen_at
                    .map(|t| (label(a), t.timestamp_millis() as f64 / 1000.0))
            }),
        )?;
        gauges(
            enc,
            "flotilla_agent_capacity_slots",
            "Slots the agent offers.",
            None,
            agents.iter().map(|a| (label(a), i64::from(a.capacity))),
        )?;
        gauges(
            enc,
            "flotilla_agent_slots_in_use",
            "Slots held by the agent's leased and running jobs.",
            None,
            agents.iter().map(|a| (label(a), i64::from(a.slots_in_use))),
        )?;
        gauges(
            enc,
            "flotilla_agent_running_jobs",
            "The agent's leased and running jobs.",
            None,
            agents.iter().map(|a| (label(a), i64::from(a.running_jobs))),
        )?;
        // From the latest heartbeat's health report.
        let health = |f: fn(&HostHealth) -> Option<f64>| {
            agents
                .iter()
                .filter_map(move |a| a.health.as_ref().and_then(f).map(|v| (label(a), v)))
        };
        let host: [HealthGauge; 5] = [
            (
                "flotilla_agent_disk_free",
                "Free bytes of the file system holding the agent's work directory.",
                Some(Unit::Bytes),
                |h| known_total(h.disk_total_bytes).map(|_| h.disk_free_bytes as f64),
            ),
            (
                "flotilla_agent_disk_total",
                "Size of the file system holding the agent's work directory.",
                Some(Unit::Bytes),
                |h| known_total(h.disk_total_bytes),
            ),
            (
                "flotilla_agent_memory_available",
                "Memory available on the agent's host.",
                Some(Unit::Bytes),
                |h| known_total(h.memory_total_bytes).map(|_| h.memory_available_bytes as f64),
            ),
            (
                "flotilla_agent_memory_total",
                "Memory of the agent's host.",
                Some(Unit::Bytes),
                |h| known_total(h.memory_total_bytes),
            ),
            (
                "flotilla_agent_load1",
                "1-minute load average of the agent's host.",
                None,
                |h| h.load_1m,
            ),
        ];
        for (name, help, unit, f) in host {
            gauges(enc, name, help, unit.as_ref(), health(f))?;
        }
        gauges(
            enc,
            "flotilla_agent_disk_nearly_full",
            "1 if the agent's work-directory disk is over 90% full.",
            None,
            agents
                .iter()
                .map(|a| (label(a), i64::from(a.disk_nearly_full))),
        )?;
        let process: [HealthGauge; 3] = [
            (
                "flotilla_agent_process_open_fds",
                "Open file descriptors of the agent process.",
                None,
                |h| h.open_fds.map(|n| n as f64),
            ),
            (
                "flotilla_agent_process_max_fds",
                "The agent process's limit on open file descriptors.",
                None,
                |h| h.max_fds.map(|n| n as f64),
            ),
            (
                "flotilla_agent_process_resident_memory",
                "Resident memory of the agent process.",
                Some(Unit::Bytes),
                |h| h.process_resident_bytes.map(|n| n as f64),
            ),
        ];
        for (name, help, unit, f) in process {
            gauges(enc, name, help, unit.as_ref(), health(f))?;
        }
        counters(
            enc,
            "flotilla_agent_process_cpu",
            "CPU time of the agent process since it started (it restarts from 0 with the process).",
            Some(&Unit::Seconds),
            health(|h| h.process_cpu_seconds),
        )?;
        let tiles = |a: &AgentView| self.tiles.get(&a.name);
        counters(
            enc,
            "flotilla_agent_tiles_done",
            "Tile jobs the agent has completed.",
            None,
            agents.iter().map(|a| {
                let n = tiles(a).map_or(0, |t| t.tiles_total);
                (label(a), u64::try_from(n).unwrap_or(0))
            }),
        )?;
        gauges(
            enc,
            "flotilla_agent_tiles_last_hour",
            "Tile jobs the agent completed in the last hour.",
            None,
            agents
                .iter()
                .map(|a| (label(a), tiles(a).map_or(0, |t| t.tiles_last_hour))),
        )?;
        gauges(
            enc,
            "flotilla_agent_tiles_per_hour",
            "Tiles per hour the agent sustains while busy: its slots over the mean tile time of the last hour (GET /api/v1/tiles/stats).",
            None,
            agents
                .iter()
                .map(|a| (label(a), tiles(a).map_or(0.0, |t| t.tiles_per_hour))),
        )
    }

    fn encode_process(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let p = &self.process;
        single_gauge(
            enc,
            "process_open_fds",
            "Open file descriptors of this server process.",
            None,
            p.open_fds,
        )?;
        single_gauge(
            enc,
            "process_max_fds",
            "This server process's limit on open file descriptors.",
            None,
            p.max_fds,
        )?;
        single_gauge(
            enc,
            "process_resident_memory",
            "Resident memory of this server process.",
            Some(&Unit::Bytes),
            p.resident_bytes,
        )?;
        single_gauge(
            enc,
            "process_virtual_memory",
            "Virtual memory of this server process.",
            Some(&Unit::Bytes),
            p.virtual_bytes,
        )?;
        single_gauge(
            enc,
            "process_start_time",
            "When this server process started, in seconds since the epoch.",
            Some(&Unit::Seconds),
            p.start_time_seconds,
        )?;
        match p.cpu_seconds {
            Some(cpu) => counters(
                enc,
                "process_cpu",
                "CPU time (user and system) of this server process.",
                Some(&Unit::Seconds),
                [(NO_LABELS, cpu)],
            ),
            None => Ok(()),
        }
    }
}

/// A sample per kind of `kinds` from `values`, 0 for a kind it lacks: every
/// kind's series exists from the start, as Prometheus rules expect.
fn by_kind<'k, V: Copy + Default>(
    kinds: &'k [String],
    values: &'k BTreeMap<String, V>,
) -> impl Iterator<Item = ([(&'static str, &'k str); 1], V)> + 'k {
    kinds.iter().map(|k| {
        let v = values.get(k).copied().unwrap_or_default();
        ([("kind", k.as_str())], v)
    })
}

/// A total of 0 means the agent could not tell (no disk matched its work
/// directory): its free and total are then unknown, not zero.
fn known_total(total: u64) -> Option<f64> {
    (total > 0).then_some(total as f64)
}

/// Every kind this server knows, and any other the tables hold (rows
/// written by a newer server), so each is exported with its zeros.
fn kinds_seen(jobs: &jobs::JobCounts, totals: &totals::Totals) -> Vec<String> {
    let mut kinds: Vec<String> = JobKind::ALL.iter().map(|k| k.as_str().to_owned()).collect();
    let more = jobs
        .by_state
        .keys()
        .map(|(k, _)| k)
        .chain(totals.attempts.keys().map(|(k, _)| k))
        .chain(totals.lease_wait.keys());
    for k in more {
        if !kinds.contains(k) {
            kinds.push(k.clone());
        }
    }
    kinds
}
