-- Each agent's host health over time (issue #14: the agent page's charts
-- and GET /api/v1/agents/{name}/health). A heartbeat carries a report every
-- few seconds; at most one per agent per sample interval (30 s by default,
-- --health-sample-interval-ms) is kept here, and rows older than the window
-- (7 days) are deleted when that agent's next sample is written: 7 days at
-- 30 s is 20,160 rows of ~100 bytes per agent. The latest report stays in
-- agents.health. Owned by server/src/agent_health.rs.
CREATE TABLE agent_health_samples (
    agent_id                uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    at                      timestamptz NOT NULL DEFAULT now(),
    -- Host CPU busy fraction (0-1) since the agent's previous reading.
    cpu_busy                real,
    memory_used_bytes       bigint NOT NULL,
    memory_total_bytes      bigint NOT NULL,
    -- Fraction (0-1) of the work directory's file system in use.
    disk_used               real,
    -- The agent process's open descriptors and their soft limit.
    open_fds                bigint,
    max_fds                 bigint,
    load_1m                 real,
    -- The agent process's CPU seconds since it started, and resident bytes.
    process_cpu_seconds     float8,
    process_resident_bytes  bigint,
    -- Reads are one agent's samples in time order, deletes one agent's
    -- oldest: both walk this key.
    PRIMARY KEY (agent_id, at)
);
