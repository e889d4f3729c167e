-- What an agent token may claim to be (issue #12, review finding M2):
-- labels and kinds an admin allows at `flotilla tokens create`, checked at
-- every registration. NULL: anything (tokens made before this column).
ALTER TABLE api_tokens
    ADD COLUMN allowed_labels jsonb,
    ADD COLUMN allowed_kinds  text[];
