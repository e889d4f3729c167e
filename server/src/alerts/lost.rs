//! `agent_lost`: an agent that should be working and stopped heartbeating
//! (silent for three heartbeat intervals, what `online` means).
//!
//! Which silent agents count: an active or draining one (it was meant to
//! work or to finish its work), and any that still holds leases, whatever
//! its state. A paused or drained agent without leases does not: an
//! operator took it out of work, and stopping it is what drain is for; it
//! counts again once resumed.

use flotilla_core::api::alerts::{AlertName, AlertView, Severity};
use flotilla_core::api::{AgentState, AgentView};

pub fn lost(agents: &[AgentView]) -> Vec<AlertView> {
    agents
        .iter()
        .filter(|a| !a.online)
        .filter(|a| {
            matches!(a.state, AgentState::Active | AgentState::Draining) || a.running_jobs > 0
        })
        .map(|a| {
            let seen = a
                .last_seen_at
                .map_or("since it registered".to_string(), |t| {
                    format!("since {} UTC", t.format("%Y-%m-%d %H:%M:%S"))
                });
            let held = match a.running_jobs {
                0 => String::new(),
                n => format!(
                    " Its {n} job{} will be retried elsewhere once the lease runs out.",
                    if n == 1 { "" } else { "s" }
                ),
            };
            AlertView {
                alert: AlertName::AgentLost,
                severity: Severity::Critical,
                subject: a.name.clone(),
                message: format!(
                    "Agent {} ({}) has not heartbeated {seen}.{held} Check its host and its \
                     process (systemctl status flotilla-agent); if it was retired on purpose, \
                     drain it (flotilla agents drain {}).",
                    a.name,
                    a.state.as_str(),
                    a.name
                ),
                since: a.last_seen_at.or(Some(a.registered_at)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn agent(name: &str, state: AgentState, online: bool, running: u32) -> AgentView {
        AgentView {
            name: name.into(),
            state,
            online,
            labels: Default::default(),
            kinds: vec![],
            capacity: 1,
            slots_in_use: running,
            running_jobs: running,
            registered_at: Utc::now(),
            last_seen_at: Some(Utc::now()),
            version: String::new(),
            health: None,
            disk_nearly_full: false,
            lease_refused: None,
            devices: Default::default(),
        }
    }

    #[test]
    fn silent_working_agents_are_lost_and_parked_ones_are_not() {
        let agents = [
            agent("up", AgentState::Active, true, 0),
            agent("gone", AgentState::Active, false, 0),
            agent("finishing", AgentState::Draining, false, 0),
            agent("parked", AgentState::Paused, false, 0),
            agent("retired", AgentState::Drained, false, 0),
            agent("paused-busy", AgentState::Paused, false, 2),
        ];
        let got: Vec<String> = lost(&agents).into_iter().map(|a| a.subject).collect();
        assert_eq!(got, ["gone", "finishing", "paused-busy"]);
    }
}
