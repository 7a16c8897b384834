-- What the HTTP server keeps: browser sessions and bulk jobs
--
-- Written only through the operator role's functions (api_operator.sql): the
-- server manages sign-ins for every role's token through it, since the
-- reader role owns no function.

-- A dashboard sign-in. The browser's cookie holds only a random session id;
-- this row holds its SHA-256 (so a copy of this table signs nobody in), the
-- token that signed in (name, role and digest: a session lives only while
-- that very token is configured, so rotating a token ends every session made
-- with it), the CSRF token its forms carry, and when it ends. Signing out
-- sets ended_at: every copy of the cookie stops working at once.
CREATE TABLE IF NOT EXISTS ledger.web_session (
    id_digest    text PRIMARY KEY CHECK (id_digest ~ '^[0-9a-f]{64}$'),
    token_name   text NOT NULL CHECK (length(token_name) BETWEEN 1 AND 64),
    token_role   text NOT NULL CHECK (token_role IN ('reader', 'operator', 'sensor')),
    token_digest text NOT NULL CHECK (token_digest ~ '^[0-9a-f]{64}$'),
    csrf         text NOT NULL CHECK (csrf ~ '^[0-9a-f]{64}$'),
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL CHECK (expires_at > created_at),
    ended_at     timestamptz
);
CREATE INDEX IF NOT EXISTS web_session_by_token ON ledger.web_session (token_name, token_digest)
    WHERE ended_at IS NULL;
CREATE INDEX IF NOT EXISTS web_session_by_expiry ON ledger.web_session (expires_at);

-- A confirmed bulk action (ledger.bulk). Its selection token's digest is
-- unique: a preview is acted on once. Each campaign acted on is one item, so
-- a large action runs in the background and reports progress and every
-- item's outcome.
CREATE TABLE IF NOT EXISTS ledger.bulk_job (
    id           text PRIMARY KEY CHECK (id ~ '^job-[0-9a-f]{32}$'),
    selection    text NOT NULL UNIQUE CHECK (selection ~ '^[0-9a-f]{64}$'),
    operator     text NOT NULL CHECK (length(operator) BETWEEN 1 AND 200),
    action       text NOT NULL CHECK (action IN ('abandon', 'reopen')),
    total        integer NOT NULL CHECK (total >= 0),
    -- what was not acted on, decided when the job started (not_previewed, ...)
    details      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(details) = 'object'),
    state        text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed')),
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    finished_at  timestamptz
);

CREATE TABLE IF NOT EXISTS ledger.bulk_job_item (
    job_id      text NOT NULL REFERENCES ledger.bulk_job (id) ON DELETE CASCADE,
    campaign_id bigint NOT NULL,
    outcome     text NOT NULL CHECK (length(outcome) BETWEEN 1 AND 100),
    at          timestamptz NOT NULL,
    PRIMARY KEY (job_id, campaign_id)
);

-- Secrets the server makes for itself when none is configured (the key of
-- bulk selection tokens): one per database, so every server process of a
-- deployment shares it and another deployment's tokens mean nothing here.
CREATE TABLE IF NOT EXISTS ledger.server_secret (
    name  text PRIMARY KEY CHECK (name ~ '^[a-z_]{1,40}$'),
    value text NOT NULL CHECK (value ~ '^[0-9a-f]{64}$')
);
