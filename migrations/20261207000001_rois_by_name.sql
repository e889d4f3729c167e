-- no-transaction
-- ROIs by name, newest first: `GET /api/v1/rois?name=…` and
-- `flotilla roi show NAME` (tiles/progress.rs, `list`). Names are not
-- unique: a region submitted again under its name is a new ROI.
-- CONCURRENTLY, in a migration of its own (see README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS rois_by_name
    ON rois (name, created_at DESC, id DESC);
