-- convergerd 0007: a save spread over the shard holders (`delivery.spread`). With more than
-- one shard, the replica that took a save asks the live holder of each other shard to write
-- that shard's clusters: one request, one part per shard asked, one item per cluster. The
-- holder claims its parts, writes the clusters under its shard's Lease, fills in each item's
-- result and marks the part done; the requester reads the results, writes whatever is left
-- over itself, records the save as one (deliveries, round_id NULL) and deletes the request.
-- Notifications on channel `convergerd_saves` ("part <id>", "done <id>") only wake the
-- replicas sooner: everything is in these rows. A request nobody deleted (its requester died)
-- is deleted by the next one, an hour after it expired.
CREATE TABLE save_requests (
    id           bigserial   PRIMARY KEY,
    policy_id    text        NOT NULL,
    revision     bigint      NOT NULL,
    requested_by text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Parts are claimed before it and done by it (the database's clock, the one all replicas
    -- share); then the requester writes what is not done.
    expires_at   timestamptz NOT NULL
);

CREATE TABLE save_parts (
    request_id bigint  NOT NULL REFERENCES save_requests (id) ON DELETE CASCADE,
    shard      integer NOT NULL,
    holder     text    NOT NULL,  -- asked of: the shard's live holder as the requester saw it
    claimed_by text,
    claimed_at timestamptz,
    done_at    timestamptz,
    PRIMARY KEY (request_id, shard)
);
CREATE INDEX save_parts_unclaimed ON save_parts (holder) WHERE claimed_by IS NULL;

CREATE TABLE save_items (
    request_id bigint  NOT NULL,
    shard      integer NOT NULL,
    cluster_id text    NOT NULL,
    action     text    NOT NULL,  -- apply or remove
    read_first boolean NOT NULL,
    result     text,  -- NULL until the holder wrote it
    reason     text,
    error      text,
    PRIMARY KEY (request_id, cluster_id, action),
    FOREIGN KEY (request_id, shard) REFERENCES save_parts (request_id, shard) ON DELETE CASCADE
);
