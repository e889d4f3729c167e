-- no-transaction
-- Retention (issue #15, server/src/queue/retention.rs): the finished jobs
-- oldest first, so that each pass reads the next batch past its cut-off
-- from this index instead of scanning every job. CONCURRENTLY, in a
-- migration of its own, so a large jobs table keeps taking writes (see
-- README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_finished
    ON jobs (finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
