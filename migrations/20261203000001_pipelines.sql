-- Pipeline runs. Owned by server/src/pipelines/. A run is its pipeline file
-- (text and parsed spec), the job that lists its items, and per item the
-- step it is at; its stage and move jobs are ordinary jobs whose parent_id
-- is the run. The engine (pipelines/engine.rs) advances runs; every change
-- of a run's items happens in a transaction that holds the run's row lock.
CREATE TABLE pipeline_runs (
    id           uuid PRIMARY KEY,
    name         text NOT NULL,
    source       text NOT NULL,
    spec         jsonb NOT NULL,
    -- listing: its items job runs; probing: its probe jobs look for
    -- outputs that exist already (a run of a file that ran before), so
    -- each item resumes after the furthest of them.
    state        text NOT NULL DEFAULT 'listing'
                 CHECK (state IN ('listing', 'probing', 'running', 'done', 'failed', 'cancelled')),
    list_job     uuid NOT NULL,
    probe_jobs   uuid[] NOT NULL DEFAULT '{}',
    items        integer,
    priority     integer NOT NULL DEFAULT 0,
    submitter    text NOT NULL,
    owner_token  uuid,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX pipeline_runs_open ON pipeline_runs (state) WHERE state IN ('listing', 'probing', 'running');
CREATE INDEX pipeline_runs_created ON pipeline_runs (created_at DESC);

-- One row per item. `at` is the last node (a stage or move, numbered in
-- file order) it finished, NULL before the first; `node` and `phase` the
-- one it is in and which of its jobs (a move: send 0, receive 1, remove 2)
-- is `job_id`. An item with state 'waiting' has no job and waits for room
-- to enter what follows `at`.
CREATE TABLE pipeline_items (
    run_id   uuid NOT NULL REFERENCES pipeline_runs (id) ON DELETE CASCADE,
    idx      integer NOT NULL,
    item     text NOT NULL,
    state    text NOT NULL DEFAULT 'waiting'
             CHECK (state IN ('waiting', 'active', 'done', 'failed', 'cancelled')),
    at       integer,
    node     integer,
    phase    smallint NOT NULL DEFAULT 0,
    job_id   uuid,
    -- Where its latest output is: {"host", "agent", "path"}.
    latest   jsonb,
    -- Each finished stage's output by stage name, for {STAGE.out}.
    outputs  jsonb NOT NULL DEFAULT '{}',
    error    text,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX pipeline_items_open ON pipeline_items (run_id, idx) WHERE state IN ('waiting', 'active');

-- One row per (item, node) the item entered: the item × stage matrix.
CREATE TABLE pipeline_steps (
    run_id       uuid NOT NULL,
    idx          integer NOT NULL,
    node         integer NOT NULL,
    state        text NOT NULL DEFAULT 'running'
                 CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    job_id       uuid,
    -- A move's destination once it arrived: {"host", "agent", "path"}.
    output       jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (run_id, idx, node),
    FOREIGN KEY (run_id, idx) REFERENCES pipeline_items (run_id, idx) ON DELETE CASCADE
);

-- Occupancy of each `limit` block: a row per item inside it. The engine
-- counts rows before it lets an item in, under the run's row lock, so the
-- count never passes the block's N, across restarts too.
CREATE TABLE pipeline_gates (
    run_id  uuid NOT NULL,
    gate    integer NOT NULL,
    idx     integer NOT NULL,
    PRIMARY KEY (run_id, gate, idx),
    FOREIGN KEY (run_id, idx) REFERENCES pipeline_items (run_id, idx) ON DELETE CASCADE
);
