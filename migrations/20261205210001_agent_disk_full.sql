-- Alerts (issue #14): an agent whose work-directory disk is over 90 % full
-- (flotilla_core::health::DISK_FULL_FRACTION) gets no new work. Since when
-- is kept on the agent's row at each registration and heartbeat
-- (server/src/agents.rs), NULL while it has room, so that the claim
-- (server/src/queue/claim.rs) checks one column of the row it already
-- reads instead of parsing the health report on every lease request, and
-- the disk_full alert (server/src/alerts/) says since when.
ALTER TABLE agents ADD COLUMN disk_full_since timestamptz;
