-- convergerd 0011: every revision of every policy kept (docs/design.md, "Revisions").
--
-- The policies table is written by others too (module-policies writes rows directly), so the
-- revisions are recorded by triggers on it, whoever writes: each insert, each update that makes
-- a new revision, and each delete (a tombstone) leaves one immutable row here with the policy's
-- content, who saved it and when. A policy's content is its whole row minus the bookkeeping
-- columns (`convergerd_policy_bookkeeping`): a column added later (an enforcement mode, a rollout
-- strategy) is content without editing these triggers.
--
-- Bounded by `CONVERGERD_REVISION_RETENTION` (the last N per policy) and
-- `CONVERGERD_REVISION_RETENTION_DAYS`: the daemon's leader prunes, logs and counts what it
-- pruned (`convergerd_policy_revisions_pruned_total`). Nothing else deletes rows here.

-- The columns of `policies` that are not a policy's content: its key, its revision and times,
-- and the deletion mark. Defined once: the content, the revision trigger and a rollback's
-- restore read it.
CREATE FUNCTION convergerd_policy_bookkeeping() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['id', 'revision', 'created_at', 'updated_at', 'deleted_at']
$$;

CREATE FUNCTION convergerd_policy_content(p policies) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(p) - convergerd_policy_bookkeeping()
$$;

-- Who saves: what the writer's transaction says (`SET LOCAL convergerd.actor = '...'`, as
-- convergerd does for an import, a rollback and a deletion), else the database role.
CREATE FUNCTION convergerd_actor() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT left(COALESCE(NULLIF(current_setting('convergerd.actor', true), ''),
                         current_user || ' (SQL)'), 200)
$$;

CREATE TABLE policy_revisions (
    policy_id  text        NOT NULL,
    revision   bigint      NOT NULL,
    -- baseline: the content the policy had when this migration ran (kept from then on)
    operation  text        NOT NULL CHECK (operation IN ('baseline', 'insert', 'update', 'delete')),
    content    jsonb,                            -- NULL for a deletion
    saved_by   text        NOT NULL,
    saved_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (policy_id, revision),
    CHECK ((operation = 'delete') = (content IS NULL))
);
-- The retention by age reads the oldest first.
CREATE INDEX policy_revisions_saved_at_idx ON policy_revisions (saved_at);

-- Immutable: a revision is never changed (a rollback makes a new one). Retention deletes.
CREATE FUNCTION convergerd_revisions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'policy revisions are immutable: revision % of policy % cannot be changed',
                    OLD.revision, OLD.policy_id
        USING ERRCODE = 'restrict_violation',
              HINT = 'To go back to an old revision, make a new one with its content: '
                     '`convergerd policy rollback ID --to REV`.';
END $$;
CREATE TRIGGER policy_revisions_immutable BEFORE UPDATE ON policy_revisions
    FOR EACH ROW EXECUTE FUNCTION convergerd_revisions_immutable();

-- The revision trigger of 0001, now on the whole content (so a column added later raises the
-- revision too), and a revision number is never used twice for one policy: a policy deleted
-- and created again continues after its tombstone.
CREATE OR REPLACE FUNCTION convergerd_policies_touch() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kept bigint;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF convergerd_policy_content(NEW) IS DISTINCT FROM convergerd_policy_content(OLD) THEN
            IF NEW.revision <= OLD.revision THEN
                NEW.revision := OLD.revision + 1;
            END IF;
            NEW.updated_at := now();
        END IF;
        IF NEW.revision = OLD.revision AND NEW.id = OLD.id THEN
            RETURN NEW;  -- no new revision: nothing is recorded
        END IF;
    END IF;
    SELECT max(revision) INTO kept FROM policy_revisions WHERE policy_id = NEW.id;
    IF kept IS NOT NULL AND NEW.revision <= kept THEN
        NEW.revision := kept + 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER policies_touch_insert BEFORE INSERT ON policies
    FOR EACH ROW EXECUTE FUNCTION convergerd_policies_touch();

CREATE FUNCTION convergerd_record_revision() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    created boolean := TG_OP = 'INSERT';
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.id = OLD.id AND NEW.revision = OLD.revision THEN
            RETURN NULL;  -- no new revision (the deletion mark set, say)
        END IF;
        created := NEW.id <> OLD.id;  -- a rename: a deletion of one id, a creation of another
    END IF;
    IF TG_OP = 'DELETE' OR created AND TG_OP = 'UPDATE' THEN
        INSERT INTO policy_revisions (policy_id, revision, operation, content, saved_by)
        SELECT OLD.id, GREATEST(OLD.revision, max(revision)) + 1, 'delete', NULL,
               convergerd_actor()
        FROM policy_revisions WHERE policy_id = OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO policy_revisions (policy_id, revision, operation, content, saved_by)
        VALUES (NEW.id, NEW.revision, CASE WHEN created THEN 'insert' ELSE 'update' END,
                convergerd_policy_content(NEW), convergerd_actor());
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER policies_revisions AFTER INSERT OR UPDATE OR DELETE ON policies
    FOR EACH ROW EXECUTE FUNCTION convergerd_record_revision();

-- A rollback: the policy's content set to `content` (a revision's), as one write of the row
-- (the triggers above make the new revision and record it). A column the content does not
-- name (added after that revision) gets its default; a key that is no longer a column is left
-- out. A policy whose row is gone (deleted) is created again. The new revision.
CREATE FUNCTION convergerd_restore_policy(policy text, content jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    names text;
    picks text;
    given_names text;
    given_picks text;
    made bigint;
BEGIN
    SELECT string_agg(format('%I', a.attname), ', ' ORDER BY a.attnum),
           string_agg(CASE WHEN content ? a.attname THEN format('r.%I', a.attname)
                           ELSE 'DEFAULT' END, ', ' ORDER BY a.attnum),
           string_agg(format(', %I', a.attname), '' ORDER BY a.attnum)
               FILTER (WHERE content ? a.attname),
           string_agg(format(', r.%I', a.attname), '' ORDER BY a.attnum)
               FILTER (WHERE content ? a.attname)
      INTO names, picks, given_names, given_picks
      FROM pg_attribute a
     WHERE a.attrelid = 'policies'::regclass AND a.attnum > 0 AND NOT a.attisdropped
       AND a.attname <> ALL (convergerd_policy_bookkeeping());
    EXECUTE format('UPDATE policies p SET (%s) = ROW(%s) '
                   'FROM jsonb_populate_record(NULL::policies, $2) r '
                   'WHERE p.id = $1 RETURNING p.revision', names, picks)
        INTO made USING policy, content;
    IF made IS NULL THEN
        EXECUTE format('INSERT INTO policies (id%s) SELECT $1%s '
                       'FROM jsonb_populate_record(NULL::policies, $2) r RETURNING revision',
                       COALESCE(given_names, ''), COALESCE(given_picks, ''))
            INTO made USING policy, content;
    END IF;
    RETURN made;
END $$;

-- What every policy holds now is its first revision kept.
INSERT INTO policy_revisions (policy_id, revision, operation, content, saved_by, saved_at)
SELECT p.id, p.revision, 'baseline', convergerd_policy_content(p),
       'convergerd migrate (the content when revisions began to be kept)', p.updated_at
FROM policies p;
