-- The operator's enforcement probe, read back with the phase: the Policy's Verified condition
-- (status True/False/Unknown, reason, message, lastProbeTime, lastTransitionTime). Nullable:
-- rows written before this migration, or by a version that does not read it, have none.
ALTER TABLE deliveries
    ADD COLUMN verified_status     text,
    ADD COLUMN verified_reason     text,
    ADD COLUMN verified_message    text,
    ADD COLUMN verified_probed_at  timestamptz,
    ADD COLUMN verified_since      timestamptz;
