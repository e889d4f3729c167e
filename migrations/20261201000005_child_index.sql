-- A child job's place among its parent's children (a revdeps shard's
-- index), so a parent reads its children in order from a column instead of
-- parsing each child's spec. Nullable, no default: adding it rewrites no
-- rows and holds the table's lock only for the catalogue change. Shards
-- made before this migration (or by a server that predates it) keep their
-- index only in their spec; the coordinator falls back to it
-- (server/src/revdeps/coordinator.rs), so no backfill runs here.
ALTER TABLE jobs ADD COLUMN child_index integer;
