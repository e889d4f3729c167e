-- opam reverse-dependency runs. Owned by server/src/revdeps.rs. A run has one
-- plan job (phase 1) and, once that succeeded, shard jobs (phase 2) whose
-- parent_id is the run; the coordinator merges their results.
CREATE TABLE revdeps_runs (
    id            uuid PRIMARY KEY,
    target        text NOT NULL,
    repo          text NOT NULL,
    variant       jsonb NOT NULL,
    query         text NOT NULL CHECK (query IN ('union', 'depopts', 'recursive', 'with-test-depopts')),
    state         text NOT NULL DEFAULT 'planning'
                  CHECK (state IN ('planning', 'solving', 'done', 'failed')),
    shard_size    integer NOT NULL CHECK (shard_size >= 1),
    priority      integer NOT NULL DEFAULT 0,
    submitter     text NOT NULL,
    plan_job      uuid NOT NULL,
    candidates    integer,
    shards        integer,
    result        jsonb,
    timings       jsonb,
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
CREATE INDEX revdeps_runs_open ON revdeps_runs (state) WHERE state IN ('planning', 'solving');
