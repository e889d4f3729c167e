//! `disk_full` and `open_files`: from the agents' latest health reports
//! (and, for open files, this server process's own reading).

use chrono::{DateTime, Utc};
use flotilla_core::api::alerts::{AlertName, AlertView, Severity};
use flotilla_core::api::AgentView;
use flotilla_core::health::{HostHealth, DISK_FULL_FRACTION};
use sqlx::PgPool;

use crate::metrics::process::Process;

const MIB: f64 = (1u64 << 20) as f64;

/// Agents whose disk the claim treats as full (`disk_full_since`, set by
/// their heartbeats): they get no new work until a report shows room.
pub async fn disk_full(db: &PgPool, agents: &[AgentView]) -> Result<Vec<AlertView>, sqlx::Error> {
    let full: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT name, disk_full_since FROM agents
         WHERE disk_full_since IS NOT NULL ORDER BY name",
    )
    .fetch_all(db)
    .await?;
    Ok(full
        .into_iter()
        .map(|(name, since)| {
            let health = agents
                .iter()
                .find(|a| a.name == name)
                .and_then(|a| a.health.as_ref());
            disk_alert(name, since, health)
        })
        .collect())
}

fn disk_alert(name: String, since: DateTime<Utc>, health: Option<&HostHealth>) -> AlertView {
    let how_full = health
        .and_then(|h| {
            h.disk_used_fraction().map(|f| {
                format!(
                    "{:.0} % full ({:.1} MiB free of {:.1} MiB)",
                    f * 100.0,
                    h.disk_free_bytes as f64 / MIB,
                    h.disk_total_bytes as f64 / MIB
                )
            })
        })
        .unwrap_or_else(|| format!("over {:.0} % full", DISK_FULL_FRACTION * 100.0));
    AlertView {
        alert: AlertName::DiskFull,
        severity: Severity::Warning,
        message: format!(
            "Agent {name}'s work-directory disk is {how_full}, so the server leases it no new \
             jobs. Free space under its work directory (old outputs, caches) or grow the disk; \
             it takes work again at its first heartbeat with room."
        ),
        subject: name,
        since: Some(since),
    }
}

/// Online agents, and this server, whose open descriptors are over
/// `fraction` of their limit. An agent that does not report both numbers
/// (Windows, an old agent) is not judged.
pub fn open_files(
    agents: &[AgentView],
    server: &Process,
    pid: u32,
    fraction: f64,
) -> Vec<AlertView> {
    let over = |open: Option<u64>, max: Option<u64>| match (open, max) {
        (Some(open), Some(max)) if max > 0 && open as f64 > fraction * max as f64 => {
            Some((open, max))
        }
        _ => None,
    };
    let sentence = |who: &str, open: u64, max: u64, raise: &str| {
        format!(
            "{who} has {open} of its {max} open files in use ({:.0} %): at the limit it cannot \
             open a connection, a log or a job's pipes. Look for a leak (ls /proc/PID/fd), or \
             raise the limit ({raise}).",
            open as f64 * 100.0 / max as f64
        )
    };
    let mut alerts: Vec<AlertView> = agents
        .iter()
        .filter(|a| a.online)
        .filter_map(|a| {
            let h = a.health.as_ref()?;
            let (open, max) = over(h.open_fds, h.max_fds)?;
            Some(AlertView {
                alert: AlertName::OpenFiles,
                severity: Severity::Warning,
                subject: a.name.clone(),
                message: sentence(
                    &format!("Agent {}", a.name),
                    open,
                    max,
                    "LimitNOFILE= in its service unit, or ulimit -n",
                ),
                since: a.last_seen_at,
            })
        })
        .collect();
    if let Some((open, max)) = over(server.open_fds, server.max_fds) {
        alerts.push(AlertView {
            alert: AlertName::OpenFiles,
            severity: Severity::Warning,
            subject: "server".to_string(),
            message: sentence(
                &format!("This server process (pid {pid})"),
                open,
                max,
                "LimitNOFILE= in its service unit; or lower --max-connections",
            ),
            since: Some(Utc::now()),
        });
    }
    alerts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, online: bool, open: Option<u64>, max: Option<u64>) -> AgentView {
        AgentView {
            name: name.into(),
            state: flotilla_core::api::AgentState::Active,
            online,
            labels: Default::default(),
            kinds: vec![],
            capacity: 1,
            slots_in_use: 0,
            running_jobs: 0,
            registered_at: Utc::now(),
            last_seen_at: Some(Utc::now()),
            version: String::new(),
            health: Some(HostHealth {
                open_fds: open,
                max_fds: max,
                ..Default::default()
            }),
            disk_nearly_full: false,
            lease_refused: None,
            devices: Default::default(),
        }
    }

    #[test]
    fn open_files_fire_above_the_fraction_only() {
        let agents = [
            agent("over", true, Some(81), Some(100)),
            agent("at", true, Some(80), Some(100)),
            agent("silent", false, Some(99), Some(100)),
            agent("unknown", true, Some(99), None),
        ];
        let server = Process {
            open_fds: Some(900),
            max_fds: Some(1000),
            ..Default::default()
        };
        let got: Vec<String> = open_files(&agents, &server, 1, 0.8)
            .into_iter()
            .map(|a| a.subject)
            .collect();
        assert_eq!(got, ["over", "server"]);
        let idle = Process {
            open_fds: Some(10),
            max_fds: Some(1000),
            ..Default::default()
        };
        assert!(open_files(&agents[1..], &idle, 1, 0.8).is_empty());
    }

    #[test]
    fn a_disk_alert_says_how_full() {
        let h = HostHealth {
            disk_total_bytes: 4 << 20,
            disk_free_bytes: 1 << 18,
            ..Default::default()
        };
        let a = disk_alert("a1".into(), Utc::now(), Some(&h));
        assert!(
            a.message.contains("94 % full (0.2 MiB free of 4.0 MiB)"),
            "{}",
            a.message
        );
    }
}
