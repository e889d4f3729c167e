-- Job classes: what a ready job needs from an agent — its kind, its labels
-- and its cost — as one row, so the claim looks only at the classes the
-- claiming agent can take and at the head of each (queue/claim.rs), instead
-- of walking every ready job that sorts ahead and filtering them one by one.
-- 100,000 ready jobs that no agent can take cost the claim nothing; before,
-- each claim scanned all of them (review reliability-39a4cd4 H7).
--
-- `unmatchable` says why no registered agent could take the class (no
-- agent runs its kind, none carries its labels, its cost is above every
-- such agent's capacity), NULL when one can. The claim reads only
-- takeable classes, so a flood of distinct unmatchable label sets does not
-- lengthen its class scan either. A trigger on agents keeps it current
-- (`flotilla_recheck_classes`). Class creation takes a shared advisory
-- lock and the recheck an exclusive one, so a class made while an agent
-- registers is seen by one or the other.
-- Owned by server/src/queue/classes.rs.

CREATE TABLE job_classes (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text NOT NULL,
    labels       jsonb NOT NULL,
    cost         integer NOT NULL,
    unmatchable  text,
    created_at   timestamptz NOT NULL DEFAULT now()
);
-- jsonb's text form is canonical (keys sorted, duplicates gone), so equal
-- label sets hash alike; the hash keeps a 64-label set within a btree
-- entry's 2.7 kB limit.
CREATE UNIQUE INDEX job_classes_key ON job_classes (kind, cost, md5(labels::text));
CREATE INDEX job_classes_takeable ON job_classes (kind) WHERE unmatchable IS NULL;

-- Why no registered agent could take a job of (kind, labels, cost), as
-- {field, message} (field: kind, labels or cost; NULL when no agent has
-- registered at all); NULL if one could. Every registered agent counts,
-- whatever its operator state: a paused or drained agent may come back.
CREATE FUNCTION flotilla_why_unmatchable(k text, l jsonb, c integer)
RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM agents)
            THEN ARRAY[NULL, 'no agent has registered yet']
        WHEN NOT EXISTS (SELECT 1 FROM agents WHERE k = ANY (kinds))
            THEN ARRAY['kind', format('no registered agent runs %s jobs', k)]
        WHEN NOT EXISTS (SELECT 1 FROM agents WHERE k = ANY (kinds) AND labels @> l)
            THEN ARRAY['labels', format(
                'no registered agent that runs %s jobs carries the labels %s', k, l)]
        WHEN NOT EXISTS (SELECT 1 FROM agents
                         WHERE k = ANY (kinds) AND labels @> l AND capacity >= c)
            THEN ARRAY['cost', format(
                'cost %s is above the capacity of every agent that could run it '
                '(the largest is %s)', c,
                (SELECT max(capacity) FROM agents WHERE k = ANY (kinds) AND labels @> l))]
    END
$$;

-- The class of (kind, labels, cost), made if new.
CREATE FUNCTION flotilla_job_class(k text, l jsonb, c integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    found bigint;
BEGIN
    SELECT id INTO found FROM job_classes
    WHERE kind = k AND cost = c AND md5(labels::text) = md5(l::text) AND labels = l;
    IF found IS NOT NULL THEN
        RETURN found;
    END IF;
    -- Held to the end of the transaction: a recheck waits until this class
    -- is visible to it.
    PERFORM pg_advisory_xact_lock_shared(hashtext('flotilla-job-classes'));
    INSERT INTO job_classes (kind, labels, cost, unmatchable)
    VALUES (k, l, c, (flotilla_why_unmatchable(k, l, c))[2])
    ON CONFLICT (kind, cost, md5(labels::text)) DO NOTHING
    RETURNING id INTO found;
    IF found IS NULL THEN
        SELECT id INTO found FROM job_classes
        WHERE kind = k AND cost = c AND md5(labels::text) = md5(l::text) AND labels = l;
    END IF;
    RETURN found;
END
$$;

-- When an agent joins or changes what it offers (labels, kinds, capacity):
-- each class says again whether some agent can take it and why not, in
-- the registering transaction. Under the exclusive lock, so a class made
-- meanwhile is seen here or sees the agent; a restart with the same offer
-- fires nothing. Its cost is classes x agents per change; few classes are
-- unmatchable once agents exist, as the API refuses those submissions.
-- Each statement of a volatile function takes a new snapshot, so the
-- update sees every class whose maker released the shared lock.
CREATE FUNCTION flotilla_recheck_classes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('flotilla-job-classes'));
    UPDATE job_classes c SET unmatchable = w.why
    FROM (SELECT id, (flotilla_why_unmatchable(kind, labels, cost))[2] AS why
          FROM job_classes) AS w
    WHERE w.id = c.id AND c.unmatchable IS DISTINCT FROM w.why;
    RETURN NULL;
END
$$;
CREATE TRIGGER agents_recheck_classes_insert AFTER INSERT ON agents
    FOR EACH ROW EXECUTE FUNCTION flotilla_recheck_classes();
CREATE TRIGGER agents_recheck_classes_update AFTER UPDATE OF labels, kinds, capacity ON agents
    FOR EACH ROW
    WHEN (OLD.labels IS DISTINCT FROM NEW.labels OR OLD.kinds IS DISTINCT FROM NEW.kinds
          OR OLD.capacity IS DISTINCT FROM NEW.capacity)
    EXECUTE FUNCTION flotilla_recheck_classes();

-- Nullable: the server sets it at insert. A row inserted without one (by a
-- server older than this migration, during a rolling upgrade) gets it from
-- the trigger; the WHEN clause keeps the trigger off the bulk insert path.
ALTER TABLE jobs ADD COLUMN class_id bigint;

CREATE FUNCTION flotilla_jobs_set_class() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.class_id := flotilla_job_class(NEW.kind, NEW.labels, NEW.cost);
    RETURN NEW;
END
$$;
CREATE TRIGGER jobs_set_class BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.class_id IS NULL) EXECUTE FUNCTION flotilla_jobs_set_class();

-- Jobs that may still be claimed (ready now, or running and possibly
-- retried) get their class; finished ones never need one.
INSERT INTO job_classes (kind, labels, cost, unmatchable)
SELECT kind, labels, cost, (flotilla_why_unmatchable(kind, labels, cost))[2]
FROM (SELECT DISTINCT kind, labels, cost FROM jobs
      WHERE state NOT IN ('succeeded', 'failed', 'cancelled')) AS live;
UPDATE jobs j SET class_id = c.id
FROM job_classes c
WHERE j.state NOT IN ('succeeded', 'failed', 'cancelled')
  AND c.kind = j.kind AND c.cost = j.cost AND c.labels = j.labels;
