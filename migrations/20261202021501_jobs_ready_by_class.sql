-- no-transaction
-- The claim's scan: within one job class, ready jobs in claim order
-- (priority, fair-share tag, age). Built CONCURRENTLY so that a large jobs
-- table keeps taking writes meanwhile; in a migration of its own because
-- CONCURRENTLY cannot share a transaction (see README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_ready_by_class
    ON jobs (class_id, priority DESC, share_seq, created_at)
    WHERE state IN ('queued', 'retrying');
