//! HTTP latency: a histogram per route template, method and status, kept in
//! this server process (each replica its own; Prometheus adds them up).
//!
//! The route is axum's [`MatchedPath`] (`/api/v1/jobs/{id}`), never the raw
//! path, so the label takes as many values as the router has routes;
//! requests that match none share `route="unmatched"`, and methods other
//! than the standard ones share `method="other"`. The time is to the
//! response head: a streamed body (logs, event streams, downloads) is not
//! waited for, and a lease long poll counts its wait (up to 30 s).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// Upper bounds, in seconds: 1 ms (a cached token and one indexed query) to
/// 60 s (past the 30 s longest lease wait, `Settings::max_lease_wait`).
const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    method: &'static str,
    route: String,
    code: u16,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The latencies this process has served, shared by its handlers (a clone
/// is a handle on the same histograms).
#[derive(Clone, Debug)]
pub struct HttpLatency {
    family: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for HttpLatency {
    fn default() -> Self {
        HttpLatency {
            family: Family::new_with_constructor(histogram),
        }
    }
}

impl HttpLatency {
    /// Adds the histogram to a scrape's registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "flotilla_http_request_duration",
            // The registry ends the help with a period.
            "Time from a request to its response head, by route template, method and status",
            Unit::Seconds,
            self.family.clone(),
        );
    }

    fn observe(&self, method: &'static str, route: String, code: u16, seconds: f64) {
        self.family
            .get_or_create(&Labels {
                method,
                route,
                code,
            })
            .observe(seconds);
    }
}

/// The middleware (`axum::middleware::from_fn_with_state`, as a
/// `Router::layer` so that the route is matched before it runs). It also
/// hands the histograms to `GET /metrics` in the request's extensions.
pub async fn record(State(latency): State<HttpLatency>, mut req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = method_label(req.method());
    req.extensions_mut().insert(latency.clone());
    let start = Instant::now();
    let response = next.run(req).await;
    latency.observe(
        method,
        route,
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

/// The method as a label: the standard ones by name, any other as "other"
/// (a client may send any token there).
fn method_label(m: &Method) -> &'static str {
    const STANDARD: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE",
    ];
    STANDARD
        .into_iter()
        .find(|s| *s == m.as_str())
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_methods_share_one_label() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        let odd = Method::from_bytes(b"BREW").expect("a valid token");
        assert_eq!(method_label(&odd), "other");
    }
}
