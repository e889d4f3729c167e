-- ROIs from before 20261208000005 take their jobs' priority where a job of
-- theirs is still kept (every tile job of an ROI is queued with its
-- priority, so any one says it). In a migration of its own, after the
-- column's: row locks on the ROIs with a priority other than 0 only, and
-- one probe of jobs_by_parent per ROI.
UPDATE rois r SET priority = p.priority
FROM (SELECT id, (SELECT j.priority FROM jobs j WHERE j.parent_id = r2.id LIMIT 1) AS priority
      FROM rois r2) p
WHERE p.id = r.id AND p.priority IS NOT NULL AND p.priority <> 0;
