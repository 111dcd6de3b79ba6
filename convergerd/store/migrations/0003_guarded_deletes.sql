-- convergerd 0003: a row whose policies are installed in clusters cannot be deleted behind
-- convergerd's back. Before, `DELETE FROM policies` (or clusters) let the forget triggers erase
-- the deliveries while the Policy objects stayed in the clusters, enforcing, with no record of
-- where. Now a policy, cluster or boundary with deliveries is refused, with an error that says
-- how to delete it. The guarded deletion (`convergerd policy delete ID`, `DELETE
-- /v1/policies/{id}`) removes the policy from every cluster, forgets those deliveries, then
-- deletes the row in the same transaction: by then nothing holds it, and the row goes.
--
-- Refused rather than turned into a deletion in progress: a writer told "deleted" must find the
-- row gone, and a deletion some cluster refuses needs someone to retry it; the API's caller gets
-- the 409 and retries, a trigger has nobody to tell.

-- The clusters holding a policy, for a message: how many, and the first five by id.
CREATE FUNCTION convergerd_holders_of(policy text, OUT n bigint, OUT sample text)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM deliveries WHERE policy_id = policy),
           (SELECT string_agg(cluster_id, ', ') FROM (
                SELECT cluster_id FROM deliveries WHERE policy_id = policy
                ORDER BY cluster_id LIMIT 5) AS first_five)
$$;

CREATE FUNCTION convergerd_guard_policy() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    held record;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.id = OLD.id THEN
        RETURN NEW;
    END IF;
    held := convergerd_holders_of(OLD.id);
    IF held.n > 0 THEN
        RAISE EXCEPTION 'policy % is installed on % cluster(s) (%): % the row would leave it '
                        'enforcing there with no record of where; delete it with '
                        '`convergerd policy delete %` (DELETE /v1/policies/%), which removes '
                        'it from every cluster first',
                        OLD.id, held.n, held.sample,
                        CASE TG_OP WHEN 'DELETE' THEN 'deleting' ELSE 'renaming' END,
                        OLD.id, OLD.id
            USING ERRCODE = 'restrict_violation',
                  HINT = 'A deletion some cluster does not confirm is refused (409) and the '
                         'policy kept until a retry finds every cluster removed it.';
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER policies_guard BEFORE DELETE OR UPDATE OF id ON policies
    FOR EACH ROW EXECUTE FUNCTION convergerd_guard_policy();

CREATE FUNCTION convergerd_guard_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    sample text;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.id = OLD.id THEN
        RETURN NEW;
    END IF;
    SELECT count(*) INTO n FROM deliveries WHERE cluster_id = OLD.id;
    IF n > 0 THEN
        SELECT string_agg(policy_id, ', ') INTO sample FROM (
            SELECT policy_id FROM deliveries WHERE cluster_id = OLD.id
            ORDER BY policy_id LIMIT 5) AS first_five;
        RAISE EXCEPTION 'cluster % holds % policies convergerd delivered (%): % the row would '
                        'leave them enforcing there with no record of where',
                        OLD.id, n, sample,
                        CASE TG_OP WHEN 'DELETE' THEN 'deleting' ELSE 'renaming' END
            USING ERRCODE = 'restrict_violation',
                  HINT = format('Take the cluster out of its boundaries and save those '
                                'policies (`convergerd policy apply ID` removes them from it), '
                                'or delete them (`convergerd policy delete ID`). If the cluster '
                                'no longer exists, forget what it held first, in the same '
                                'transaction and with the table locked so that a round cannot '
                                'record it meanwhile: LOCK TABLE deliveries IN SHARE ROW '
                                'EXCLUSIVE MODE; DELETE FROM deliveries WHERE cluster_id = %L',
                                OLD.id);
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER clusters_guard BEFORE DELETE OR UPDATE OF id ON clusters
    FOR EACH ROW EXECUTE FUNCTION convergerd_guard_cluster();

CREATE FUNCTION convergerd_guard_boundary() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sample text;
BEGIN
    SELECT string_agg(id, ', ') INTO sample FROM (
        SELECT p.id FROM policies p
        WHERE p.boundary_id = OLD.id
          AND EXISTS (SELECT 1 FROM deliveries d WHERE d.policy_id = p.id)
        ORDER BY p.id LIMIT 5) AS first_five;
    IF sample IS NOT NULL THEN
        RAISE EXCEPTION 'boundary % has policies installed in clusters (%): deleting it would '
                        'leave them there, invalid, never removed by a save; delete those '
                        'policies first with `convergerd policy delete ID` '
                        '(DELETE /v1/policies/{id})', OLD.id, sample
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER boundaries_guard BEFORE DELETE ON boundaries
    FOR EACH ROW EXECUTE FUNCTION convergerd_guard_boundary();

-- TRUNCATE fires no row trigger: refused as a whole while anything is delivered.
CREATE FUNCTION convergerd_guard_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deliveries) THEN
        RAISE EXCEPTION 'TRUNCATE % would leave every policy convergerd delivered enforcing in '
                        'its clusters with no record of where; delete policies with '
                        '`convergerd policy delete ID`', TG_TABLE_NAME
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER policies_guard_truncate BEFORE TRUNCATE ON policies
    FOR EACH STATEMENT EXECUTE FUNCTION convergerd_guard_truncate();
CREATE TRIGGER clusters_guard_truncate BEFORE TRUNCATE ON clusters
    FOR EACH STATEMENT EXECUTE FUNCTION convergerd_guard_truncate();
CREATE TRIGGER boundaries_guard_truncate BEFORE TRUNCATE ON boundaries
    FOR EACH STATEMENT EXECUTE FUNCTION convergerd_guard_truncate();
