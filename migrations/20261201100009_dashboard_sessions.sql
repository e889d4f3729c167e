-- Dashboard sessions (issue #12): the cookie holds a random session id, not
-- the API token; only its sha256 is stored. A session ends at logout, at
-- expiry, or when its token is revoked (checked on every page and every few
-- seconds on live streams). Owned by server/src/dashboard/session.rs.
CREATE TABLE dashboard_sessions (
    id_hash    bytea PRIMARY KEY,
    token_id   uuid NOT NULL REFERENCES api_tokens (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    ended_at   timestamptz
);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);
