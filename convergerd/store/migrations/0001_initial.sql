-- convergerd 0001: the fleet (clusters, boundaries, policies) and what convergerd did with it
-- (rounds, per-cluster state, per policy-and-cluster deliveries, invalid policies).
--
-- No foreign keys from the record tables (deliveries, cluster_state, invalid_policies) to the
-- fleet tables: a round is recorded after the fleet was read, and a row removed meanwhile must
-- not fail the whole record. Triggers remove the records of a deleted cluster or policy instead.

CREATE TABLE clusters (
    id          text        PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE boundaries (
    id          text        PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE boundary_clusters (
    boundary_id text NOT NULL REFERENCES boundaries (id) ON DELETE CASCADE,
    cluster_id  text NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    PRIMARY KEY (boundary_id, cluster_id)
);
CREATE INDEX boundary_clusters_cluster_idx ON boundary_clusters (cluster_id);

-- Written by module-policies as well as by `convergerd import`: ids and rules are not
-- constrained here, convergerd validates each row and reports the invalid ones.
CREATE TABLE policies (
    id          text        PRIMARY KEY,
    boundary_id text        NOT NULL,
    rule        jsonb       NOT NULL,            -- the whole rule mapping, `type` included
    enabled     boolean     NOT NULL DEFAULT true,
    revision    bigint      NOT NULL DEFAULT 1,  -- increases on every content change
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz                      -- set while a deletion is in progress
);
CREATE INDEX policies_boundary_idx ON policies (boundary_id);

-- A writer that changes a policy's content without raising its revision still gets a new
-- revision, so clusters always learn about the change.
CREATE FUNCTION convergerd_policies_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.boundary_id, NEW.rule, NEW.enabled) IS DISTINCT FROM
       (OLD.boundary_id, OLD.rule, OLD.enabled) THEN
        IF NEW.revision <= OLD.revision THEN
            NEW.revision := OLD.revision + 1;
        END IF;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER policies_touch BEFORE UPDATE ON policies
    FOR EACH ROW EXECUTE FUNCTION convergerd_policies_touch();

-- Save on NOTIFY: listeners on `convergerd_policies` receive the changed policy's id.
CREATE FUNCTION convergerd_policies_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('convergerd_policies', COALESCE(NEW.id, OLD.id));
    RETURN NULL;
END $$;
CREATE TRIGGER policies_notify AFTER INSERT OR UPDATE OR DELETE ON policies
    FOR EACH ROW EXECUTE FUNCTION convergerd_policies_notify();

CREATE TABLE rounds (
    id                bigserial   PRIMARY KEY,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz,
    result            text        NOT NULL CHECK (result IN ('ok', 'partial', 'failed')),
    epoch_holder      text,
    epoch_transitions bigint,
    identity          text        NOT NULL,      -- the replica that ran it
    counts            jsonb       NOT NULL DEFAULT '{}',
    error             text
);

-- The latest outcome per cluster, for /status and metrics on any replica.
CREATE TABLE cluster_state (
    cluster_id      text        PRIMARY KEY,
    last_attempt_at timestamptz,
    last_success_at timestamptz,                 -- last time it fully converged
    last_reached_at timestamptz,
    reachable       boolean,
    last_error      text,
    last_reason     text,
    desired         integer     NOT NULL DEFAULT 0,
    in_sync         integer     NOT NULL DEFAULT 0,
    failed          integer     NOT NULL DEFAULT 0,
    server_version  text,
    duration_s      double precision,
    round_id        bigint
);

-- One row per policy and cluster: the last delivery and the last phase read back.
-- Rewritten every round, on columns that are not indexed: room for HOT updates.
CREATE TABLE deliveries (
    policy_id          text        NOT NULL,
    cluster_id         text        NOT NULL,
    delivered_revision bigint,                   -- last revision the cluster accepted
    last_result        text CHECK (last_result IN ('created', 'updated', 'unchanged', 'failed')),
    last_attempt_at    timestamptz,
    last_success_at    timestamptz,
    last_error         text,
    last_reason        text,
    attempts           integer     NOT NULL DEFAULT 0,  -- consecutive failed attempts
    round_id           bigint,                   -- NULL when written by a save
    phase              text,
    phase_reason       text,
    phase_message      text,
    phase_revision     bigint,
    phase_seen_at      timestamptz,
    PRIMARY KEY (policy_id, cluster_id)
) WITH (fillfactor = 70);
CREATE INDEX deliveries_cluster_idx ON deliveries (cluster_id);

-- What the last round found invalid, with when it was first seen at that revision.
CREATE TABLE invalid_policies (
    policy_id     text        PRIMARY KEY,
    boundary_id   text        NOT NULL,
    revision      bigint      NOT NULL,
    reason        text        NOT NULL,
    first_seen_at timestamptz NOT NULL,
    seen_at       timestamptz NOT NULL,
    round_id      bigint
);

CREATE FUNCTION convergerd_forget_policy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM deliveries WHERE policy_id = OLD.id;
    DELETE FROM invalid_policies WHERE policy_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER policies_forget AFTER DELETE ON policies
    FOR EACH ROW EXECUTE FUNCTION convergerd_forget_policy();

CREATE FUNCTION convergerd_forget_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM deliveries WHERE cluster_id = OLD.id;
    DELETE FROM cluster_state WHERE cluster_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER clusters_forget AFTER DELETE ON clusters
    FOR EACH ROW EXECUTE FUNCTION convergerd_forget_cluster();
