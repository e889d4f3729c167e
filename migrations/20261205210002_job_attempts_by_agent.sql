-- no-transaction
-- Alerts (issue #14, server/src/alerts/): an agent's attempts newest first,
-- for when it last leased (queue stalled) and its recent run times against
-- its own history (job-time drift), read per agent without scanning every
-- attempt. Built CONCURRENTLY so that job_attempts keeps taking writes
-- meanwhile; in a migration of its own because CONCURRENTLY cannot share a
-- transaction (see README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_attempts_by_agent
    ON job_attempts (agent_id, leased_at DESC);
