-- convergerd 0012: what the operator reports beside the phase, read back with it and recorded
-- with it, so a standby shows what the leader read: the mode of the binding in force
-- (`status.enforcementAction`), the API server's admission counts (`status.admission`) and
-- the audit's excepted objects (`status.audit.excepted`). Nullable: rows written before this
-- migration, or by a version that does not read them, have none.
ALTER TABLE deliveries
    ADD COLUMN enforcement_action          text,
    -- Whether counts were read: admission_read_at or admission_problem is not null. Counts
    -- that could not be read are null, and admission_problem says why.
    ADD COLUMN admission_denied            bigint,
    ADD COLUMN admission_warned            bigint,
    ADD COLUMN admission_audited           bigint,
    ADD COLUMN admission_last_hour_denied  bigint,
    ADD COLUMN admission_last_hour_warned  bigint,
    ADD COLUMN admission_last_hour_audited bigint,
    ADD COLUMN admission_since             timestamptz,
    ADD COLUMN admission_read_at           timestamptz,
    ADD COLUMN admission_revision          bigint,
    ADD COLUMN admission_resets            bigint,
    ADD COLUMN admission_note              text,
    ADD COLUMN admission_problem           text,
    ADD COLUMN audit_excepted              bigint;
ALTER TABLE cluster_state
    -- The oldest admission readAt the last listing read: every one there is at least this
    -- recent (readAt moves at the operator's heartbeat; per row it is written only with new
    -- figures), as listed_audited_at is for the audits.
    ADD COLUMN listed_admission_read_at timestamptz;
