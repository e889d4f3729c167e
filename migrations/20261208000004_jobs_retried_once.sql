-- no-transaction
-- One retry per job: two retries of it at once (two operators, a double
-- click) would queue its work twice. Also how a job finds its retry.
-- CONCURRENTLY, in a migration of its own (see README.md).
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_retried_once
    ON jobs (retry_of)
    WHERE retry_of IS NOT NULL;
