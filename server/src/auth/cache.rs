//! A per-process cache of recently seen tokens and agent ids; the database
//! rebuilds it on a miss.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Caller;

/// Recently seen tokens and agent ids, so that the hot agent calls (lease,
/// complete) do not pay two extra queries each. Rebuilt from the database on
/// a miss; an entry lives [`CACHE_TTL`]. A revocation empties this server's
/// token cache at once; on other servers sharing the database a revoked
/// token keeps working for at most [`CACHE_TTL`].
#[derive(Default)]
pub struct AuthCache {
    tokens: std::sync::Mutex<HashMap<Vec<u8>, (Caller, Instant)>>,
    agents: std::sync::Mutex<HashMap<String, Uuid>>,
}

pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Past this many entries the token cache is cleared rather than grown.
const CACHE_MAX: usize = 10_000;

impl AuthCache {
    pub(super) fn get(&self, hash: &[u8]) -> Option<Caller> {
        let map = self
            .tokens
            .lock()
            .expect("auth cache lock is never poisoned");
        map.get(hash)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(c, _)| c.clone())
    }

    pub(super) fn put(&self, hash: Vec<u8>, caller: Caller) {
        let mut map = self
            .tokens
            .lock()
            .expect("auth cache lock is never poisoned");
        if map.len() >= CACHE_MAX {
            map.clear();
        }
        map.insert(hash, (caller, Instant::now()));
    }

    /// Drops every cached token (after a revocation).
    pub fn forget_tokens(&self) {
        self.tokens
            .lock()
            .expect("auth cache lock is never poisoned")
            .clear();
    }

    /// The id of a registered agent (agents are never deleted, and a name
    /// keeps its id across re-registration).
    pub fn agent_id(&self, name: &str) -> Option<Uuid> {
        self.agents
            .lock()
            .expect("auth cache lock is never poisoned")
            .get(name)
            .copied()
    }

    pub fn remember_agent(&self, name: &str, id: Uuid) {
        self.agents
            .lock()
            .expect("auth cache lock is never poisoned")
            .insert(name.to_string(), id);
    }
}
