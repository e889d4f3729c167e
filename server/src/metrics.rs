//! `GET /metrics`: Prometheus text exposition, computed from the same
//! tables the API reads at each scrape, so any server instance answers the
//! same and nothing is kept in memory.

use std::fmt::Write;

use axum::extract::State;
use axum::response::IntoResponse;

use crate::auth::MetricsAuth;
use crate::error::ApiResult;
use crate::state::AppState;

/// Label values may hold anything; escape as the exposition format asks.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub async fn metrics(
    State(state): State<AppState>,
    MetricsAuth(_): MetricsAuth,
) -> ApiResult<impl IntoResponse> {
    let mut out = String::new();
    let jobs: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT kind, state, count(*) FROM jobs GROUP BY kind, state ORDER BY 1, 2")
            .fetch_all(&state.db)
            .await?;
    out.push_str("# HELP flotilla_jobs Jobs by kind and state.\n# TYPE flotilla_jobs gauge\n");
    for (kind, st, n) in jobs {
        let _ = writeln!(
            out,
            "flotilla_jobs{{kind=\"{}\",state=\"{}\"}} {n}",
            esc(&kind),
            esc(&st)
        );
    }
    let attempts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT COALESCE(outcome, 'in_progress'), count(*) FROM job_attempts GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&state.db)
    .await?;
    out.push_str(
        "# HELP flotilla_job_attempts_total Attempts by outcome.\n# TYPE flotilla_job_attempts_total counter\n",
    );
    for (outcome, n) in attempts {
        let _ = writeln!(
            out,
            "flotilla_job_attempts_total{{outcome=\"{}\"}} {n}",
            esc(&outcome)
        );
    }
    let oldest: Option<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float8 FROM jobs
         WHERE state IN ('queued', 'retrying')",
    )
    .fetch_one(&state.db)
    .await?;
    out.push_str(
        "# HELP flotilla_queue_oldest_ready_seconds Age of the oldest job waiting to run.\n\
         # TYPE flotilla_queue_oldest_ready_seconds gauge\n",
    );
    let _ = writeln!(
        out,
        "flotilla_queue_oldest_ready_seconds {}",
        oldest.unwrap_or(0.0)
    );

    let agents = crate::agents::list(&state.db, state.settings.heartbeat_interval).await?;
    let gauges: [(&str, &str); 6] = [
        ("flotilla_agent_up", "1 if the agent heartbeated recently."),
        ("flotilla_agent_capacity_slots", "Slots the agent offers."),
        (
            "flotilla_agent_slots_in_use",
            "Slots held by leased and running jobs.",
        ),
        (
            "flotilla_agent_disk_free_bytes",
            "Free bytes of the agent's work-directory disk.",
        ),
        (
            "flotilla_agent_disk_nearly_full",
            "1 if the work-directory disk is over 90% full.",
        ),
        ("flotilla_agent_load1", "1-minute load average."),
    ];
    for (name, help) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for a in &agents {
            let v = match name {
                "flotilla_agent_up" => a.online as u8 as f64,
                "flotilla_agent_capacity_slots" => a.capacity as f64,
                "flotilla_agent_slots_in_use" => a.slots_in_use as f64,
                "flotilla_agent_disk_free_bytes" => a
                    .health
                    .as_ref()
                    .map_or(f64::NAN, |h| h.disk_free_bytes as f64),
                "flotilla_agent_disk_nearly_full" => a.disk_nearly_full as u8 as f64,
                _ => a
                    .health
                    .as_ref()
                    .and_then(|h| h.load_1m)
                    .unwrap_or(f64::NAN),
            };
            let _ = writeln!(
                out,
                "{name}{{agent=\"{}\",state=\"{}\"}} {v}",
                esc(&a.name),
                a.state.as_str()
            );
        }
    }
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    ))
}
