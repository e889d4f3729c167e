-- A cap on each attempt's stored log (issue #12): the head and a rolling
-- tail are kept, with one marker line (stream 'cut') between them. The
-- counters live on the attempt; `tail` marks the lines that may be trimmed.
-- Constant defaults: no table rewrite.
ALTER TABLE job_attempts
    ADD COLUMN log_bytes      bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_tail_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_cut_lines  bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_cut_bytes  bigint NOT NULL DEFAULT 0,
    ADD COLUMN log_cut_seq    bigint;
ALTER TABLE job_logs ADD COLUMN tail boolean NOT NULL DEFAULT false;
