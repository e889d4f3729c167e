-- no-transaction
-- A run's active items, which the engine reads every pass (the jobs that
-- ended, the room taken in each step), without scanning its waiting ones.
-- CONCURRENTLY, in a migration of its own (see README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS pipeline_items_active
    ON pipeline_items (run_id, node)
    WHERE state = 'active';
