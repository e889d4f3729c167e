-- A job's log batches are numbered per attempt by the agent (LogBatch.batch);
-- the highest stored is kept here, so a batch sent again after its answer
-- was lost (a timeout, a 5xx, a server restart) is not stored twice.
-- A constant default: no table rewrite.
ALTER TABLE job_attempts ADD COLUMN log_batch bigint NOT NULL DEFAULT 0;
