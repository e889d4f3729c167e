-- The durable queue: agents, API tokens, jobs and their attempts, logs and
-- outputs. Owned by server/src/queue/ (jobs, attempts, logs, outputs),
-- server/src/agents.rs (agents) and server/src/auth.rs (api_tokens).

CREATE TABLE api_tokens (
    id           uuid PRIMARY KEY,
    -- sha256 of the secret; the secret itself is shown once and never stored.
    token_hash   bytea NOT NULL UNIQUE,
    role         text NOT NULL CHECK (role IN ('admin', 'client', 'agent')),
    -- For agent tokens: the only name this token may register as.
    agent_name   text,
    description  text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    CHECK ((role = 'agent') = (agent_name IS NOT NULL))
);

CREATE TABLE agents (
    id             uuid PRIMARY KEY,
    name           text NOT NULL UNIQUE,
    state          text NOT NULL DEFAULT 'active'
                   CHECK (state IN ('active', 'paused', 'draining', 'drained')),
    labels         jsonb NOT NULL DEFAULT '{}',
    kinds          text[] NOT NULL DEFAULT '{}',
    capacity       integer NOT NULL CHECK (capacity >= 0),
    version        text NOT NULL DEFAULT '',
    devices        jsonb NOT NULL DEFAULT 'null',
    health         jsonb,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz
);

CREATE TABLE jobs (
    id                uuid PRIMARY KEY,
    kind              text NOT NULL,
    spec              jsonb NOT NULL,
    state             text NOT NULL DEFAULT 'queued'
                      CHECK (state IN ('queued', 'leased', 'running', 'succeeded',
                                       'failed', 'cancelled', 'retrying')),
    priority          integer NOT NULL DEFAULT 0,
    labels            jsonb NOT NULL DEFAULT '{}',
    cost              integer NOT NULL DEFAULT 1 CHECK (cost >= 1),
    submitter         text NOT NULL,
    -- Start tag for start-time fair queuing between submitters: a new job
    -- gets max(its submitter's last ready tag + 1, the smallest ready tag), so
    -- the claim order (priority, share_seq) interleaves submitters and one
    -- with 10,000 queued jobs does not starve one with 10. See queue/submit.rs.
    share_seq         bigint NOT NULL DEFAULT 0,
    attempt           integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL CHECK (max_attempts >= 1),
    run_after         timestamptz NOT NULL DEFAULT now(),
    agent_id          uuid REFERENCES agents (id),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    cancel_requested  boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    exit_code         integer,
    error             text,
    progress_done     bigint,
    progress_total    bigint,
    result            jsonb,
    -- A job made by another (a revdeps shard, a tile of an ROI).
    parent_id         uuid,
    CHECK ((state IN ('leased', 'running')) = (lease_token IS NOT NULL))
);

-- The claim scans this in order and takes the first row that fits the agent.
CREATE INDEX jobs_ready ON jobs (priority DESC, share_seq, created_at)
    WHERE state IN ('queued', 'retrying');
CREATE INDEX jobs_ready_by_submitter ON jobs (submitter, share_seq)
    WHERE state IN ('queued', 'retrying');
CREATE INDEX jobs_active_by_agent ON jobs (agent_id)
    WHERE state IN ('leased', 'running');
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at)
    WHERE state IN ('leased', 'running');
CREATE INDEX jobs_by_state_created ON jobs (state, created_at DESC);
CREATE INDEX jobs_by_parent ON jobs (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE job_attempts (
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    agent_id     uuid REFERENCES agents (id),
    lease_token  uuid NOT NULL,
    leased_at    timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz,
    -- succeeded | failed | timed_out | cancelled | lease_expired
    outcome      text,
    exit_code    integer,
    message      text,
    PRIMARY KEY (job_id, attempt)
);

CREATE TABLE job_logs (
    job_id   uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq      bigserial,
    attempt  integer NOT NULL,
    stream   text NOT NULL,
    line     text NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- Objects uploaded by an attempt. Only the outputs of the attempt that
-- succeeded are listed with the job (attempt = jobs.attempt, state succeeded).
CREATE TABLE job_outputs (
    job_id   uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt  integer NOT NULL,
    name     text NOT NULL,
    key      text NOT NULL,
    size     bigint NOT NULL,
    sha256   text NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, attempt, name)
);

-- Back-off before retry `attempt + 1`: base · 2^(attempt−1), capped, times a
-- jitter in [0.5, 1.5) so that jobs that failed together do not retry in
-- lockstep. One definition, used by the reaper and by failed attempts.
CREATE FUNCTION flotilla_backoff(attempt integer, base_ms bigint, max_ms bigint)
RETURNS interval LANGUAGE sql VOLATILE AS $$
    SELECT make_interval(secs =>
        LEAST(base_ms * power(2, GREATEST(attempt - 1, 0)), max_ms)::double precision
        * (0.5 + random()) / 1000.0)
$$;
