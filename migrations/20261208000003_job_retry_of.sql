-- The job a retry (POST /api/v1/jobs/{id}/retry, the dashboard's Retry)
-- was made from, so that each job's page links the other and a job is
-- retried once (a second retry names the first). No foreign key: a job
-- past its retention is archived and deleted while its retry stays.
ALTER TABLE jobs ADD COLUMN retry_of uuid;
