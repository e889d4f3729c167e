-- no-transaction
-- The claim no longer walks all ready jobs in priority order
-- (jobs_ready_by_class replaced it), and nothing else reads this index;
-- dropping it saves a write per job state change. A server older than
-- 20261202021500 still claims correctly without it, only slower, for the
-- length of a rolling upgrade.
DROP INDEX CONCURRENTLY IF EXISTS jobs_ready;
