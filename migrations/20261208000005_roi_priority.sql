-- The priority an ROI's tile jobs were queued with, so that submitting it
-- again (the dashboard's "Submit again") queues its missing tiles at the
-- same priority, not at 0. A column with a constant default: no rewrite.
ALTER TABLE rois ADD COLUMN priority integer NOT NULL DEFAULT 0;
