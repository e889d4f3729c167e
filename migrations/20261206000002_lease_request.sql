-- The agent's id for a lease request (issue #15, reliability review L6):
-- an agent sends the same id with every retry of one request, so a server
-- that leased a job for it (and whose answer was lost, say with the server
-- killed) answers that lease again instead of leasing a second job while
-- the first one's lease runs out unused. NULL for claims made without one.
-- A nullable column without a default: no table rewrite.
ALTER TABLE job_attempts ADD COLUMN lease_request uuid;
