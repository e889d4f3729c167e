//! An agent process driven by a test over the agent protocol, timing its
//! heartbeats.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::api::Api;
use crate::procs::Server;

/// An agent process driven by a test: registered, holding `leases`,
/// heartbeating.
pub struct Driven {
    pub api: Api,
    /// (job id, lease token) of each lease held, sent with every heartbeat.
    pub leases: Mutex<Vec<(String, String)>>,
    /// A heartbeat not answered within this fails (a lease TTL, say).
    pub heartbeat_timeout: Duration,
}

impl Driven {
    /// Makes an agent token for `name` and registers a process for it with
    /// `kinds`.
    pub async fn register(
        server: &Server,
        name: &str,
        kinds: &[&str],
        heartbeat_timeout: Duration,
    ) -> Driven {
        let token = server.api().agent_token(name).await;
        let api = server.api().agent_process(&token);
        let health = serde_json::to_value(flotilla_core::health::HostHealth::default())
            .expect("health serialises");
        api.post(
            "/api/agent/v1/register",
            json!({"name": name, "instance": api.instance(), "capacity": 4,
                   "kinds": kinds, "version": "test", "health": health}),
        )
        .await;
        Driven {
            api,
            leases: Mutex::new(Vec::new()),
            heartbeat_timeout,
        }
    }

    /// Leases the next job; returns (job id, lease token).
    pub async fn lease(&self) -> (String, String) {
        let v = self
            .api
            .post("/api/agent/v1/lease", json!({"wait_ms": 10_000}))
            .await;
        let job = &v["job"];
        let lease = (
            job["job_id"]
                .as_str()
                .expect("a job was leased")
                .to_string(),
            job["lease_token"]
                .as_str()
                .expect("lease token")
                .to_string(),
        );
        self.leases.lock().unwrap().push(lease.clone());
        lease
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.api
            .http
            .request(method, format!("{}{path}", self.api.base))
            .bearer_auth(&self.api.token)
            .header(
                flotilla_core::protocol::INSTANCE_HEADER,
                self.api.instance(),
            )
    }

    /// One heartbeat for every lease held: Ok(latency) if answered 200 with
    /// every lease to continue.
    pub async fn heartbeat(&self) -> Result<Duration, String> {
        let leases: Vec<Value> = self
            .leases
            .lock()
            .unwrap()
            .iter()
            .map(|(job, lease)| json!({"job_id": job, "lease_token": lease}))
            .collect();
        let health = serde_json::to_value(flotilla_core::health::HostHealth::default())
            .expect("health serialises");
        let start = Instant::now();
        let resp = self
            .request(reqwest::Method::POST, "/api/agent/v1/heartbeat")
            .json(&json!({"health": health, "leases": leases}))
            .timeout(self.heartbeat_timeout)
            .send()
            .await
            .map_err(|e| format!("heartbeat not answered: {e}"))?;
        let status = resp.status();
        let body: Value = resp.json().await.map_err(|e| e.to_string())?;
        let took = start.elapsed();
        if !status.is_success() {
            return Err(format!("heartbeat: {status} {body}"));
        }
        for l in body["leases"].as_array().into_iter().flatten() {
            if l["action"] != "continue" {
                return Err(format!("lease {} lost: {body}", l["job_id"]));
            }
        }
        Ok(took)
    }
}

/// Heartbeats: when each was sent, and its latency or why it failed.
pub type Beats = Vec<(Instant, Result<Duration, String>)>;

/// Heartbeats every `every` until `stop`.
pub fn heartbeat_loop(
    agent: Arc<Driven>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Beats> {
    tokio::spawn(async move {
        let mut beats = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let at = Instant::now();
            beats.push((at, agent.heartbeat().await));
            tokio::time::sleep(every).await;
        }
        beats
    })
}

/// The latencies and failures of the heartbeats sent in `from..to`.
pub fn beats_between(beats: &Beats, from: Instant, to: Instant) -> (Vec<Duration>, Vec<String>) {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for (at, b) in beats.iter().filter(|(at, _)| (from..to).contains(at)) {
        match b {
            Ok(d) => ok.push(*d),
            Err(e) => failed.push(format!("{:?} in: {e}", at.duration_since(from))),
        }
    }
    (ok, failed)
}

/// (p50, p99, max) of `d`.
pub fn percentiles(d: &[Duration]) -> (Duration, Duration, Duration) {
    let mut d = d.to_vec();
    d.sort();
    let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), *d.last().expect("some heartbeats"))
}
