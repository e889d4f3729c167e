-- The dashboard's revdeps pages (server/src/revdeps/read.rs): the runs
-- newest first, paged by (created_at, id), and the earlier runs of one
-- target that a run's answer can be compared with.
CREATE INDEX revdeps_runs_newest ON revdeps_runs (created_at DESC, id DESC);
CREATE INDEX revdeps_runs_by_target ON revdeps_runs (target, created_at DESC);
