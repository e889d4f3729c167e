//! A per-process cache of recently seen tokens (valid and refused) and agent
//! ids; the database rebuilds it on a miss.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit};
use uuid::Uuid;

use super::Caller;

/// Recently seen tokens and agent ids, so that the hot agent calls (lease,
/// complete) do not pay two extra queries each, and so that a flood of bad
/// tokens costs the database little.
///
/// - A valid token is kept [`CACHE_TTL`]; after that it is *stale*: checked
///   against the database again at its next use, but as a token known to
///   have been good, outside the unknown-token gate below.
/// - A refused token (unknown or revoked) is kept [`CACHE_TTL`] too, so the
///   same bad token repeated costs one query per TTL. At most
///   [`REFUSED_MAX`] are kept, so a flood of distinct random tokens cannot
///   grow memory.
/// - A token never seen waits for one of [`UNKNOWN_LOOKUPS`] permits before
///   its query: a flood of distinct random tokens holds at most that many
///   pool connections, however many arrive at once.
///
/// A revocation makes every cached token stale on this server at once, so a
/// revoked token stops working here at its next use; on other servers
/// sharing the database a revoked token keeps working for at most
/// [`CACHE_TTL`].
pub struct AuthCache {
    tokens: Mutex<Known>,
    refused: Mutex<HashMap<Vec<u8>, Instant>>,
    unknown_lookups: Semaphore,
    agents: Mutex<HashMap<String, Uuid>>,
}

struct Known {
    /// token hash → the caller and when the database last said so.
    by_hash: HashMap<Vec<u8>, (Caller, Instant)>,
    /// Entries checked at or before this are stale (the last revocation).
    stale_before: Option<Instant>,
}

pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Past this many entries the valid-token cache is cleared rather than
/// grown (only tokens the database accepted get in, so only a fleet this
/// large reaches it).
const CACHE_MAX: usize = 10_000;
/// Most refused tokens remembered (about 100 bytes each).
const REFUSED_MAX: usize = 10_000;
/// Most database lookups of never-seen tokens at once: a few, so that a
/// flood of random tokens leaves the rest of the pool (48) alone while a
/// real new client waits at most a few milliseconds per token ahead of it.
pub const UNKNOWN_LOOKUPS: usize = 4;

/// What the cache knows about a token.
pub(super) enum Cached {
    /// Accepted within [`CACHE_TTL`].
    Valid(Caller),
    /// Accepted once, longer ago: ask the database again.
    Stale,
    /// Refused within [`CACHE_TTL`].
    Refused,
    /// Never seen (or forgotten): ask the database, through the gate.
    Unknown,
}

impl Default for AuthCache {
    fn default() -> Self {
        AuthCache {
            tokens: Mutex::new(Known {
                by_hash: HashMap::new(),
                stale_before: None,
            }),
            refused: Mutex::default(),
            unknown_lookups: Semaphore::new(UNKNOWN_LOOKUPS),
            agents: Mutex::default(),
        }
    }
}

impl AuthCache {
    pub(super) fn get(&self, hash: &[u8]) -> Cached {
        {
            let known = self
                .tokens
                .lock()
                .expect("auth cache lock is never poisoned");
            if let Some((caller, at)) = known.by_hash.get(hash) {
                return if at.elapsed() < CACHE_TTL && known.stale_before.is_none_or(|t| *at > t) {
                    Cached::Valid(caller.clone())
                } else {
                    Cached::Stale
                };
            }
        }
        let refused = self
            .refused
            .lock()
            .expect("auth cache lock is never poisoned");
        match refused.get(hash) {
            Some(at) if at.elapsed() < CACHE_TTL => Cached::Refused,
            _ => Cached::Unknown,
        }
    }

    /// Waits for a turn to look up a never-seen token.
    pub(super) async fn unknown_lookup(&self) -> SemaphorePermit<'_> {
        self.unknown_lookups
            .acquire()
            .await
            .expect("the unknown-token semaphore is never closed")
    }

    pub(super) fn put(&self, hash: Vec<u8>, caller: Caller) {
        let mut known = self
            .tokens
            .lock()
            .expect("auth cache lock is never poisoned");
        if known.by_hash.len() >= CACHE_MAX {
            known.by_hash.clear();
        }
        known.by_hash.insert(hash, (caller, Instant::now()));
    }

    /// Remembers that the database refused `hash` (and forgets it as valid).
    pub(super) fn refuse(&self, hash: Vec<u8>) {
        self.tokens
            .lock()
            .expect("auth cache lock is never poisoned")
            .by_hash
            .remove(&hash);
        let mut refused = self
            .refused
            .lock()
            .expect("auth cache lock is never poisoned");
        if refused.len() >= REFUSED_MAX {
            refused.retain(|_, at| at.elapsed() < CACHE_TTL);
            if refused.len() >= REFUSED_MAX {
                // A flood of distinct tokens: the cache cannot help against
                // it (the gate does), so start afresh rather than grow.
                refused.clear();
            }
        }
        refused.insert(hash, Instant::now());
    }

    /// Makes every cached valid token stale (after a revocation): each is
    /// checked against the database at its next use.
    pub fn forget_tokens(&self) {
        self.tokens
            .lock()
            .expect("auth cache lock is never poisoned")
            .stale_before = Some(Instant::now());
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

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::api::TokenRole;

    fn caller() -> Caller {
        Caller {
            token_id: Uuid::nil(),
            role: TokenRole::Client,
            agent_name: None,
            description: None,
        }
    }

    #[test]
    fn a_refused_token_is_remembered_and_a_revocation_makes_valid_ones_stale() {
        let cache = AuthCache::default();
        assert!(matches!(cache.get(b"bad"), Cached::Unknown));
        cache.refuse(b"bad".to_vec());
        assert!(matches!(cache.get(b"bad"), Cached::Refused));

        cache.put(b"good".to_vec(), caller());
        assert!(matches!(cache.get(b"good"), Cached::Valid(_)));
        cache.forget_tokens();
        assert!(matches!(cache.get(b"good"), Cached::Stale));
        // Re-checked and still good: valid again.
        std::thread::sleep(Duration::from_millis(1));
        cache.put(b"good".to_vec(), caller());
        assert!(matches!(cache.get(b"good"), Cached::Valid(_)));
        // Re-checked and revoked: refused.
        cache.refuse(b"good".to_vec());
        assert!(matches!(cache.get(b"good"), Cached::Refused));
    }

    #[test]
    fn a_flood_of_distinct_refused_tokens_stays_bounded() {
        let cache = AuthCache::default();
        for i in 0..3 * REFUSED_MAX {
            cache.refuse(format!("junk-{i}").into_bytes());
        }
        let n = cache.refused.lock().unwrap().len();
        assert!(n <= REFUSED_MAX, "{n} refused tokens kept");
    }
}
