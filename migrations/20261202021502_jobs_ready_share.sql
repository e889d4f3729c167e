-- no-transaction
-- The smallest fair-share tag among ready jobs, which every submission
-- reads (queue/submit.rs): with this index it is the index's first live
-- entry, where before it was a scan of every ready job.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_ready_share
    ON jobs (share_seq)
    WHERE state IN ('queued', 'retrying');
