-- Job ownership and a metrics role (issue #12).
--
-- A job belongs to the token that submitted it (or whose ROI or revdeps run
-- made it): a client reads and cancels only its own jobs, admins all. NULL
-- for jobs submitted before this column existed: admins only.
ALTER TABLE jobs ADD COLUMN owner_token uuid;
CREATE INDEX jobs_owner ON jobs (owner_token, created_at DESC) WHERE owner_token IS NOT NULL;

-- `metrics` tokens read /metrics and nothing else (for Prometheus).
ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_role_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_role_check
    CHECK (role IN ('admin', 'client', 'agent', 'metrics'));
