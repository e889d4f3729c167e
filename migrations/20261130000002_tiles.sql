-- TESSERA tiles: datasets (a model and where its inputs are), coverage (which
-- embeddings exist), regions of interest, and the tile → job mapping that
-- keeps re-submission from adding duplicate jobs. Owned by
-- server/src/tiles/.

CREATE TABLE datasets (
    name               text PRIMARY KEY,
    -- The checkpoint in the object store, uploaded with
    -- PUT /api/v1/datasets/{name}/checkpoint; agents cache it by sha256.
    checkpoint_key     text,
    checkpoint_sha256  text,
    checkpoint_size    bigint,
    -- Inputs: objects `{input_prefix}/{year}/{tile}/bands.npy` etc. in the
    -- store, or a command the agent runs to fetch them into a directory.
    input_prefix       text,
    fetch_command      text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (input_prefix IS NOT NULL OR fetch_command IS NOT NULL)
);

-- Which (dataset, year, tile) embeddings exist. A tile is its cell: column
-- ix (longitudes ix/10 … (ix+1)/10) and row iy, as flotilla_core::grid.
CREATE TABLE coverage (
    dataset      text NOT NULL REFERENCES datasets (name) ON DELETE CASCADE,
    year         integer NOT NULL,
    iy           integer NOT NULL,
    ix           integer NOT NULL,
    source       text NOT NULL CHECK (source IN ('fleet', 'import')),
    grid_size    bigint NOT NULL,
    scales_size  bigint NOT NULL,
    -- The job that produced it (fleet only).
    job_id       uuid,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dataset, year, iy, ix)
);

CREATE TABLE rois (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    dataset     text NOT NULL REFERENCES datasets (name),
    year        integer NOT NULL,
    -- The region as submitted: {"geojson": …} or {"bbox": [w, s, e, n]}.
    region      jsonb NOT NULL,
    total       bigint NOT NULL,
    present     bigint NOT NULL,
    -- Tiles already queued or running for another submission.
    in_flight   bigint NOT NULL,
    submitted   bigint NOT NULL,
    submitter   text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The job that produces each (dataset, year, tile). One row per tile: a
-- re-submission finds it and adds nothing while the job is alive or
-- succeeded; a failed or cancelled one is replaced.
CREATE TABLE tile_jobs (
    dataset  text NOT NULL,
    year     integer NOT NULL,
    iy       integer NOT NULL,
    ix       integer NOT NULL,
    job_id   uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    roi_id   uuid REFERENCES rois (id) ON DELETE SET NULL,
    PRIMARY KEY (dataset, year, iy, ix)
);
CREATE INDEX tile_jobs_by_roi ON tile_jobs (roi_id);
CREATE INDEX tile_jobs_by_job ON tile_jobs (job_id);
