-- convergerd 0008: enforcement modes. A policy's `enforcement` says what admission does with a
-- request its rule fails: Deny (reject it: the source documents' behaviour, so every existing
-- row and every writer that does not know the column keeps it), Warn (admit it with a warning)
-- or Audit (admit it, record the failure in the API server's audit log). The operator renders
-- it as the binding's validationActions ([Deny], [Warn, Audit], [Audit]).
--
-- Unlike ids and rules, the mode is constrained here: three fixed names, and a writer that
-- stores anything else would otherwise leave a policy that is invalid everywhere.
-- A constant default: no table rewrite, existing rows read 'Deny'.
ALTER TABLE policies
    ADD COLUMN enforcement text NOT NULL DEFAULT 'Deny'
        CONSTRAINT policies_enforcement_check CHECK (enforcement IN ('Deny', 'Warn', 'Audit'));

-- A change of mode is a change of content like any other: a new revision, so every cluster
-- learns of it (the trigger of 0001, with the mode among what it compares).
CREATE OR REPLACE FUNCTION convergerd_policies_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.boundary_id, NEW.rule, NEW.enabled, NEW.enforcement) IS DISTINCT FROM
       (OLD.boundary_id, OLD.rule, OLD.enabled, OLD.enforcement) THEN
        IF NEW.revision <= OLD.revision THEN
            NEW.revision := OLD.revision + 1;
        END IF;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END $$;
