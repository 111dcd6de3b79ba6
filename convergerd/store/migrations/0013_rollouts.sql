-- convergerd 0013: rollouts in waves (docs/design.md, "Rollouts: the revision model").
--
-- Opt-in: a policy without a strategy (its own, else its boundary's) is saved as before, to
-- every cluster at once. A save of a policy with one starts a rollout: each cluster of the
-- policy's scope gets a wave (fixed at start) and keeps the revision it had until its wave is
-- due; rounds deliver each cluster its due revision. The rollout's state and current wave are
-- here, so a change of leader neither repeats nor skips a wave.

-- Labels choose waves (`ring: canary`); written by the import file.
ALTER TABLE clusters ADD COLUMN labels jsonb NOT NULL DEFAULT '{}';

-- A strategy's document as the import file gives it (validated by `core.rollout.parse_strategy`
-- when written and when read).
CREATE TABLE rollout_strategies (
    id         text        PRIMARY KEY,
    spec       jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A strategy id (validated on read: a policy naming an unknown one is invalid). Not content:
-- how a revision is delivered is not what it is, so a change of strategy makes no revision (and
-- no delivery), and a rollback keeps the strategy the policy has now.
ALTER TABLE policies   ADD COLUMN rollout_strategy text;
ALTER TABLE boundaries ADD COLUMN rollout_strategy text;   -- the boundary's policies' default

CREATE OR REPLACE FUNCTION convergerd_policy_bookkeeping() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['id', 'revision', 'created_at', 'updated_at', 'deleted_at', 'rollout_strategy']
$$;

CREATE TABLE rollouts (
    id              bigserial   PRIMARY KEY,
    policy_id       text        NOT NULL,
    to_revision     bigint      NOT NULL,
    from_revision   bigint,          -- the policy's revision before the save (NULL: new policy)
    strategy_id     text        NOT NULL,
    strategy        jsonb       NOT NULL,   -- snapshot at start: later edits don't move it
    state           text        NOT NULL CHECK (state IN (
        'progressing', 'waiting_approval', 'paused', 'halted', 'reverted', 'aborted',
        'completed', 'superseded')),
    wave            integer     NOT NULL DEFAULT 0 CHECK (wave >= 0),   -- current wave index
    wave_started_at timestamptz NOT NULL DEFAULT now(),
    wave_ready_at   timestamptz,            -- every wave cluster reported to_revision: bake starts
    warn_step       boolean     NOT NULL DEFAULT false, -- the wave is in its Warn step
    reason          text,                   -- why halted / paused / waiting
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    updated_by      text        NOT NULL
);
-- At most one live rollout per policy.
CREATE UNIQUE INDEX rollouts_live ON rollouts (policy_id)
    WHERE state IN ('progressing', 'waiting_approval', 'paused', 'halted');
-- At most one rollout in force per policy: a live one, or a reverted or aborted one whose
-- clusters rounds keep at their previous revision until the policy's next save ends it. Rounds
-- read these each round (an index scan of nothing when no rollout is in force).
CREATE UNIQUE INDEX rollouts_in_force ON rollouts (policy_id)
    WHERE state NOT IN ('completed', 'superseded');
CREATE INDEX rollouts_policy_idx ON rollouts (policy_id, id);

-- Per cluster of a rollout: its wave (fixed at start) and the revision it had then (the due
-- revision of the rollout this one superseded, or from_revision): "a newer save during a
-- rollout starts a new one from where each cluster is".
CREATE TABLE rollout_clusters (
    rollout_id        bigint  NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
    cluster_id        text    NOT NULL,
    wave              integer NOT NULL,
    previous_revision bigint,          -- NULL: the cluster had no copy (gets nothing until due)
    PRIMARY KEY (rollout_id, cluster_id)
);

-- Who, when, what: every transition and every command.
CREATE TABLE rollout_events (
    rollout_id bigint      NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
    at         timestamptz NOT NULL DEFAULT now(),
    by         text        NOT NULL,
    what       text        NOT NULL,
    wave       integer,
    detail     text
);
CREATE INDEX rollout_events_rollout_idx ON rollout_events (rollout_id, at);
