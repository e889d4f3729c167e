-- A run's items by state, and its step cells by (step, state) with the
-- seconds the finished ones took: kept by statement triggers, in the
-- transaction of each change, for a run's view. It counted them with a
-- GROUP BY over every item and cell instead, on every refresh of the live
-- page and every second of `flotilla pipeline run --wait`: 66 ms at 50,000
-- items x 5 steps. Owned by server/src/pipelines/ (read.rs reads them).
--
-- Every statement that changes a run's items or cells holds the run's row
-- (pipelines/engine.rs, pipelines/mod.rs), so two never update one run's
-- totals at once; a writer that did not could deadlock with another on
-- these rows. No foreign key to pipeline_runs: a run deleted by hand
-- cascades to its items, whose trigger then updates the totals (its rows
-- stay, at 0; a run's view reads only rows other than 0).
--
-- First, every pass of a running server over a run is let finish and no
-- new one starts until this commits: each holds its run's row, which this
-- lock waits for. Without it, a pass that had written a cell and was about
-- to write an item deadlocked with the triggers' locks below, taken one
-- table after the other, and the migration was the one rolled back.
LOCK TABLE pipeline_runs IN EXCLUSIVE MODE;

CREATE TABLE pipeline_item_totals (
    run_id  uuid NOT NULL,
    state   text NOT NULL,
    n       bigint NOT NULL,
    PRIMARY KEY (run_id, state)
);

CREATE TABLE pipeline_step_totals (
    run_id   uuid NOT NULL,
    node     integer NOT NULL,
    state    text NOT NULL,
    n        bigint NOT NULL,
    -- Cells with an end, and the seconds from their start to it.
    timed    bigint NOT NULL,
    seconds  float8 NOT NULL,
    PRIMARY KEY (run_id, node, state)
);

-- Each statement's rows as they are (added) and as they were (taken off):
-- an INSERT has only the first, a DELETE only the second, and a branch
-- that is not taken is not planned, so it may name a table the trigger
-- does not have.
CREATE FUNCTION flotilla_pipeline_item_totals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO pipeline_item_totals AS t (run_id, state, n)
        SELECT run_id, state, count(*) FROM new_rows
        GROUP BY run_id, state ORDER BY run_id, state
        ON CONFLICT (run_id, state) DO UPDATE SET n = t.n + EXCLUDED.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO pipeline_item_totals AS t (run_id, state, n)
        SELECT run_id, state, -count(*) FROM old_rows
        GROUP BY run_id, state ORDER BY run_id, state
        ON CONFLICT (run_id, state) DO UPDATE SET n = t.n + EXCLUDED.n;
    ELSE
        INSERT INTO pipeline_item_totals AS t (run_id, state, n)
        SELECT run_id, state, sum(d) FROM (
            SELECT run_id, state, 1 AS d FROM new_rows
            UNION ALL
            SELECT run_id, state, -1 FROM old_rows
        ) x GROUP BY run_id, state HAVING sum(d) <> 0 ORDER BY run_id, state
        ON CONFLICT (run_id, state) DO UPDATE SET n = t.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$$;

-- A cell's part of its (run, step, state) total: one cell, whether it has
-- an end, and its seconds.
CREATE FUNCTION flotilla_pipeline_step_totals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO pipeline_step_totals AS t (run_id, node, state, n, timed, seconds)
        SELECT run_id, node, state, count(*), count(finished_at),
               COALESCE(sum(EXTRACT(EPOCH FROM finished_at - started_at)::float8), 0)
        FROM new_rows GROUP BY run_id, node, state ORDER BY run_id, node, state
        ON CONFLICT (run_id, node, state) DO UPDATE
            SET n = t.n + EXCLUDED.n, timed = t.timed + EXCLUDED.timed,
                seconds = t.seconds + EXCLUDED.seconds;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO pipeline_step_totals AS t (run_id, node, state, n, timed, seconds)
        SELECT run_id, node, state, -count(*), -count(finished_at),
               -COALESCE(sum(EXTRACT(EPOCH FROM finished_at - started_at)::float8), 0)
        FROM old_rows GROUP BY run_id, node, state ORDER BY run_id, node, state
        ON CONFLICT (run_id, node, state) DO UPDATE
            SET n = t.n + EXCLUDED.n, timed = t.timed + EXCLUDED.timed,
                seconds = t.seconds + EXCLUDED.seconds;
    ELSE
        INSERT INTO pipeline_step_totals AS t (run_id, node, state, n, timed, seconds)
        SELECT run_id, node, state, sum(d), sum(d * timed), sum(d * seconds) FROM (
            SELECT run_id, node, state, 1 AS d, (finished_at IS NOT NULL)::int AS timed,
                   COALESCE(EXTRACT(EPOCH FROM finished_at - started_at)::float8, 0) AS seconds
            FROM new_rows
            UNION ALL
            SELECT run_id, node, state, -1, (finished_at IS NOT NULL)::int,
                   COALESCE(EXTRACT(EPOCH FROM finished_at - started_at)::float8, 0)
            FROM old_rows
        ) x GROUP BY run_id, node, state
        -- Not a write for a cell whose job or output alone changed.
        HAVING sum(d) <> 0 OR sum(d * timed) <> 0 OR sum(d * seconds) <> 0
        ORDER BY run_id, node, state
        ON CONFLICT (run_id, node, state) DO UPDATE
            SET n = t.n + EXCLUDED.n, timed = t.timed + EXCLUDED.timed,
                seconds = t.seconds + EXCLUDED.seconds;
    END IF;
    RETURN NULL;
END
$$;

-- Transition tables need one trigger per event.
CREATE TRIGGER pipeline_items_totals_insert AFTER INSERT ON pipeline_items
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_item_totals();
CREATE TRIGGER pipeline_items_totals_update AFTER UPDATE ON pipeline_items
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_item_totals();
CREATE TRIGGER pipeline_items_totals_delete AFTER DELETE ON pipeline_items
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_item_totals();
CREATE TRIGGER pipeline_steps_totals_insert AFTER INSERT ON pipeline_steps
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_step_totals();
CREATE TRIGGER pipeline_steps_totals_update AFTER UPDATE ON pipeline_steps
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_step_totals();
CREATE TRIGGER pipeline_steps_totals_delete AFTER DELETE ON pipeline_steps
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_step_totals();

-- TRUNCATE fires no DELETE trigger: it empties the totals with the table.
CREATE FUNCTION flotilla_pipeline_totals_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'pipeline_items' THEN
        DELETE FROM pipeline_item_totals;
    ELSE
        DELETE FROM pipeline_step_totals;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER pipeline_items_totals_truncate AFTER TRUNCATE ON pipeline_items
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_totals_truncated();
CREATE TRIGGER pipeline_steps_totals_truncate AFTER TRUNCATE ON pipeline_steps
    FOR EACH STATEMENT EXECUTE FUNCTION flotilla_pipeline_totals_truncated();

-- The runs there are. The locks above have made writers of both tables
-- wait for this transaction (and this waited for those already writing),
-- so nothing changes between these counts and the triggers.
INSERT INTO pipeline_item_totals (run_id, state, n)
SELECT run_id, state, count(*) FROM pipeline_items GROUP BY run_id, state;
INSERT INTO pipeline_step_totals (run_id, node, state, n, timed, seconds)
SELECT run_id, node, state, count(*), count(finished_at),
       COALESCE(sum(EXTRACT(EPOCH FROM finished_at - started_at)::float8), 0)
FROM pipeline_steps GROUP BY run_id, node, state;
