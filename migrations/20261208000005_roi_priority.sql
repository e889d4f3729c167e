-- The priority an ROI's tile jobs were queued with, so that submitting it
-- again (the dashboard's "Submit again") queues its missing tiles at the
-- same priority, not at 0. ROIs from before take their jobs' priority
-- where a job of theirs is still kept.
ALTER TABLE rois ADD COLUMN priority integer NOT NULL DEFAULT 0;
UPDATE rois r SET priority = j.priority
FROM (SELECT DISTINCT ON (parent_id) parent_id, priority FROM jobs
      WHERE parent_id IS NOT NULL AND kind = 'tile'
      ORDER BY parent_id, created_at) j
WHERE j.parent_id = r.id;
