-- no-transaction
-- Job lists page newest first on (created_at, id) (queue/read.rs,
-- issue #14): the first page is this index's first entries, a later one
-- starts at its cursor. Without it a list with no filter sorted every job
-- for each page: with 300,000 jobs a parallel scan and top-N sort of
-- 60 ms, against 0.08 ms with it (EXPLAIN ANALYZE, PostgreSQL 15). One
-- state needs nothing new: jobs_by_state_created plus an incremental sort
-- of the jobs sharing a created_at answers in 0.1 ms. CONCURRENTLY, so a
-- large jobs table keeps taking writes meanwhile (see README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_newest_first
    ON jobs (created_at DESC, id DESC);
