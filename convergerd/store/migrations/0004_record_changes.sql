-- convergerd 0004: a round records what changed, not every delivery again. Before, every round
-- rewrote every delivery row because its times moved (2,000 clusters x 50 policies: 100,000 rows
-- and 32 MB of WAL per in-sync round). Now a delivery row is written when its facts change
-- (revision, result, error, phase, Verified verdict), and what a round confirmed unchanged is
-- recorded once per cluster, here: every row of the cluster it did not write was read then, as
-- recorded. Readers derive a row's times from these (`convergerd.store.store`); rows written
-- before this migration carry their own times, and the first round after it sets these.
ALTER TABLE cluster_state
    -- When the last round to list this cluster's Policies read them: each recorded phase there
    -- was seen then, and each recorded success there still held (a policy no longer listed had
    -- its phase cleared by that round).
    ADD COLUMN listed_at        timestamptz,
    -- The oldest Verified lastProbeTime that listing read: every probe there is at least this
    -- recent (the operators' probe times move every probe period; per row, they are written
    -- only with a new verdict).
    ADD COLUMN listed_probed_at timestamptz;
