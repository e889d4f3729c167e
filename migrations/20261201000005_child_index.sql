-- A child job's place among its parent's children (a revdeps shard's
-- index), so a parent reads its children in order from a column instead of
-- parsing each child's spec. Nullable, no default: adding it rewrites no
-- rows. Existing shards are backfilled from their specs
-- (`{"step":{"solve":{"shard":N,…}}}`).
ALTER TABLE jobs ADD COLUMN child_index integer;
UPDATE jobs SET child_index = (spec -> 'step' -> 'solve' ->> 'shard')::integer
 WHERE kind = 'revdeps' AND spec -> 'step' ? 'solve';
