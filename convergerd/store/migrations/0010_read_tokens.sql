-- convergerd 0010: read tokens, each scoped to one boundary (`convergerd token create`,
-- `POST /v1/tokens`). Only a token's SHA-256 is kept: the token is shown once, when it is
-- made. A revoked token's row stays (who revoked it, when) until someone deletes it; a name
-- is unique among the tokens not revoked. Every change notifies `convergerd_tokens`, so each
-- replica reads the live tokens again at once (revocation takes effect on every replica
-- within the notification's delay; a replica whose listener was down reads them every
-- `auth.REFRESH_S` anyway).
CREATE TABLE read_tokens (
    id          bigserial   PRIMARY KEY,
    name        text        NOT NULL,
    boundary_id text        NOT NULL,
    token_hash  bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_by  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_by  text,
    revoked_at  timestamptz,
    CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);
CREATE UNIQUE INDEX read_tokens_live_name ON read_tokens (name) WHERE revoked_at IS NULL;

CREATE FUNCTION convergerd_tokens_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('convergerd_tokens', '');
    RETURN NULL;
END $$;
CREATE TRIGGER read_tokens_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON read_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION convergerd_tokens_notify();
