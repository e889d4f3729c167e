-- no-transaction
-- Finds the attempt an agent's retried lease request already made
-- (queue/claim.rs, `already_leased`). Only attempts made with a request id
-- are in it. CONCURRENTLY, in a migration of its own (see README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_attempts_by_lease_request
    ON job_attempts (agent_id, lease_request)
    WHERE lease_request IS NOT NULL;
