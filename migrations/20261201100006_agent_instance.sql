-- The agent process that may call for an agent (issue #12): each process
-- registers with a random instance id and sends it on every call; the
-- server answers only the latest one, so a second process under the same
-- name can neither report for nor fail the first one's leases. NULL for
-- agents registered before this column existed (their leases are treated
-- as orphans at their next registration).
ALTER TABLE agents ADD COLUMN instance uuid;
