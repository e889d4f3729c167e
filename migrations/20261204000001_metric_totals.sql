-- Running totals behind /metrics' counters and histograms: attempts by kind
-- and outcome, the run time of succeeded attempts by kind and agent, and the
-- lease wait by kind. Prometheus counters may only go up, so these cannot be
-- counts over a window of job_attempts (they would fall as attempts age
-- out), and counting all of job_attempts at every scrape costs a scan of
-- millions of rows every 15 s. Instead each lease and each attempt's end
-- appends one row to metric_events, in the transaction that records it;
-- a scrape folds the events into metric_totals (kinds x agents x buckets
-- rows) and deletes them, and reads totals plus any events not yet folded.
-- Appending never waits on another transaction, where incrementing a
-- shared counter row would serialise every completion of a kind.
-- Owned by server/src/metrics/totals.rs.

CREATE TABLE metric_events (
    kind      text NOT NULL,
    agent_id  uuid,
    -- NULL for a lease; the attempt's outcome for an end.
    outcome   text,
    -- A lease: seconds from ready (run_after) to leased. An end: the
    -- attempt's run time (started to finished) if it succeeded, else NULL.
    seconds   float8
);

CREATE TABLE metric_totals (
    -- 'attempts', 'duration' or 'lease_wait'.
    family   text NOT NULL,
    kind     text NOT NULL,
    -- The agent's name for 'duration', else ''.
    agent    text NOT NULL DEFAULT '',
    -- The attempt's outcome for 'attempts', else ''.
    outcome  text NOT NULL DEFAULT '',
    -- A histogram bucket's upper bound; its count is not cumulative (the
    -- exposition adds them up). 'Infinity' for plain counts.
    le       float8 NOT NULL DEFAULT 'Infinity',
    n        bigint NOT NULL,
    -- Sum of the observations counted in n.
    sum_seconds  float8 NOT NULL DEFAULT 0,
    PRIMARY KEY (family, kind, agent, outcome, le)
);

-- A lease: how long the job had been ready. The claim's AFTER trigger runs
-- once its statement is done; run_after is when the job became ready (its
-- submission, or the end of a retry's back-off).
CREATE FUNCTION flotilla_metric_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_events (kind, agent_id, outcome, seconds)
    SELECT j.kind, NEW.agent_id, NULL,
           GREATEST(extract(epoch FROM NEW.leased_at - j.run_after)::float8, 0)
    FROM jobs j WHERE j.id = NEW.job_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER job_attempts_metric_lease AFTER INSERT ON job_attempts
    FOR EACH ROW EXECUTE FUNCTION flotilla_metric_lease();

-- An attempt's end: the first time its outcome is set.
CREATE FUNCTION flotilla_metric_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_events (kind, agent_id, outcome, seconds)
    SELECT j.kind, NEW.agent_id, NEW.outcome,
           CASE WHEN NEW.outcome = 'succeeded' AND NEW.started_at IS NOT NULL
                THEN GREATEST(extract(epoch FROM NEW.finished_at - NEW.started_at)::float8, 0)
           END
    FROM jobs j WHERE j.id = NEW.job_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER job_attempts_metric_end_insert AFTER INSERT ON job_attempts
    FOR EACH ROW WHEN (NEW.outcome IS NOT NULL) EXECUTE FUNCTION flotilla_metric_end();
CREATE TRIGGER job_attempts_metric_end AFTER UPDATE OF outcome ON job_attempts
    FOR EACH ROW WHEN (OLD.outcome IS NULL AND NEW.outcome IS NOT NULL)
    EXECUTE FUNCTION flotilla_metric_end();

-- The attempts that ended before this migration, as events for the first
-- scrape to fold. CREATE TRIGGER above locks job_attempts against writes
-- until this transaction commits, so none is counted twice or missed.
-- Their lease waits are not: run_after has moved on since.
INSERT INTO metric_events (kind, agent_id, outcome, seconds)
SELECT j.kind, a.agent_id, a.outcome,
       CASE WHEN a.outcome = 'succeeded' AND a.started_at IS NOT NULL
            THEN GREATEST(extract(epoch FROM a.finished_at - a.started_at)::float8, 0)
       END
FROM job_attempts a JOIN jobs j ON j.id = a.job_id
WHERE a.outcome IS NOT NULL;
