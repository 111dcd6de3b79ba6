-- convergerd 0006: the operator's audit (`status.audit`: existing objects in the boundary's
-- namespaces that the policy would deny), read back with the phase and recorded with it, so a
-- standby shows what the leader read. Per row only the count, the time and the synced flag
-- (samples stay in the reading replica's memory). Nullable: rows written before this
-- migration, or by a version that does not read audits, have none.
ALTER TABLE deliveries
    -- Whether an audit was read: audit_synced is not null. An audit that could not be read
    -- has a null count and says why in audit_problem.
    ADD COLUMN audit_violations bigint,
    ADD COLUMN audit_at         timestamptz,
    ADD COLUMN audit_synced     boolean,
    ADD COLUMN audit_problem    text;
ALTER TABLE cluster_state
    -- The oldest auditedAt the last listing read: every audit there is at least this recent
    -- (auditedAt moves every pass of the operator; per row it is written only with a new
    -- count, flag or problem), as listed_probed_at is for the probes.
    ADD COLUMN listed_audited_at timestamptz;
