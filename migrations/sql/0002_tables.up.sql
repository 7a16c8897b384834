-- 0002 tables
--
-- The data of Ledger. Owner-only: no runtime role has any privilege on these
-- tables; they read through views and write through ledger_api functions.
-- Every status column is checked against a closed list or a reference table.

-- States of a campaign. Terminal states are sticky (enforced in 0003).
CREATE TABLE ledger.state (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z_]+$'),
    is_terminal boolean NOT NULL,
    position    smallint NOT NULL UNIQUE,  -- display order
    description text NOT NULL
);

-- Who may perform a transition. db_role is the role suffix that executes the
-- function owning it; 'system' transitions happen only inside other functions.
CREATE TABLE ledger.actor (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z_]+$'),
    db_role     text CHECK (db_role ~ '^[a-z_]+$'),
    description text NOT NULL
);

-- The one source of truth for the state machine (DESIGN section 2).
CREATE TABLE ledger.transition (
    name       text NOT NULL CHECK (name ~ '^[a-z_]+$'),
    from_state text REFERENCES ledger.state (name),  -- NULL: the campaign is created
    to_state   text NOT NULL REFERENCES ledger.state (name),
    owner_role text NOT NULL REFERENCES ledger.actor (name),
    note       text NOT NULL DEFAULT '',
    CONSTRAINT transition_unique UNIQUE NULLS NOT DISTINCT (name, from_state),
    CONSTRAINT transition_moves CHECK (from_state IS DISTINCT FROM to_state)
);

-- A kind of campaign: attempt budget, lease length, backoff, who may touch what.
-- The worker-side config (attempt command, repository) lives in ledger.toml;
-- what the kernel must judge lives here.
CREATE TABLE ledger.campaign_class (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    max_attempts    integer NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 1000),
    lease_seconds   double precision NOT NULL DEFAULT 60 CHECK (lease_seconds > 0),
    backoff_base_s  double precision NOT NULL DEFAULT 5 CHECK (backoff_base_s >= 0),
    backoff_factor  double precision NOT NULL DEFAULT 2 CHECK (backoff_factor >= 1),
    backoff_cap_s   double precision NOT NULL DEFAULT 600 CHECK (backoff_cap_s >= 0),
    backoff_jitter  double precision NOT NULL DEFAULT 0.1 CHECK (backoff_jitter BETWEEN 0 AND 1),
    -- which campaigns share a seat (one lease per seat): none, or one per target
    seat_policy     text NOT NULL DEFAULT 'none' CHECK (seat_policy IN ('none', 'target')),
    -- {"worker": {"refs": ["refs/heads/ledger/*"], "hosts": []}, "dispatcher": {...}}
    authority       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(authority) = 'object'),
    acceptance      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(acceptance) = 'object'),
    -- where a verified candidate is promoted: {"repository": "...", "ref": "refs/heads/main"}
    promotion       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(promotion) = 'object'),
    verifier        text NOT NULL DEFAULT 'command',
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL
);

CREATE TABLE ledger.campaign (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    class               text NOT NULL REFERENCES ledger.campaign_class (name),
    objective_key       text NOT NULL CHECK (length(objective_key) BETWEEN 1 AND 500),
    target              text NOT NULL CHECK (length(target) BETWEEN 1 AND 2000),
    desired_state       jsonb NOT NULL DEFAULT '{}',
    opening_observation jsonb NOT NULL DEFAULT '{}',
    state               text NOT NULL REFERENCES ledger.state (name),
    lease_owner         text,
    leased_at           timestamptz,
    lease_expires_at    timestamptz,
    generation          bigint NOT NULL DEFAULT 0 CHECK (generation >= 0),
    attempt_count       integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts        integer NOT NULL CHECK (max_attempts > 0),
    next_attempt_at     timestamptz NOT NULL,
    last_failure_reason text,
    acceptance_criteria jsonb NOT NULL DEFAULT '{}',
    evidence_location   text,
    seat                text CHECK (seat <> ''),
    priority            integer NOT NULL DEFAULT 0,
    labels              text[] NOT NULL DEFAULT '{}',
    -- last journal seq; bumped under this row's lock, so seqs are gap-free
    event_seq           bigint NOT NULL DEFAULT 0,
    promoted_at         timestamptz,
    promoted_sha        text,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    closed_at           timestamptz,
    CONSTRAINT campaign_lease_iff_leased CHECK (
        (state = 'leased') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- Mechanism 7: invariants as indexes.
-- One open campaign per objective (exhausted is open: a human decides).
CREATE UNIQUE INDEX campaign_one_open_per_objective ON ledger.campaign (objective_key)
    WHERE state NOT IN ('confirmed', 'dismissed', 'abandoned');
-- One leased campaign per seat; a NULL seat is unlimited.
CREATE UNIQUE INDEX campaign_one_lease_per_seat ON ledger.campaign (seat)
    WHERE state = 'leased' AND seat IS NOT NULL;
-- The claim path: ready rows in claim order, and nothing else.
CREATE INDEX campaign_claim_order ON ledger.campaign (priority DESC, created_at, id)
    WHERE state = 'ready';
CREATE INDEX campaign_lease_expiry ON ledger.campaign (lease_expires_at)
    WHERE state = 'leased';
CREATE INDEX campaign_awaiting_verdict ON ledger.campaign (updated_at, id)
    WHERE state = 'attempted';
CREATE INDEX campaign_recent ON ledger.campaign (updated_at DESC, id DESC);
CREATE INDEX campaign_by_class_state ON ledger.campaign (class, state);

-- Sensors' observations of targets. (sensor, tick) is unique: two sensor
-- processes on one schedule record one observation per tick.
CREATE TABLE ledger.observation (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sensor          text NOT NULL CHECK (length(sensor) BETWEEN 1 AND 200),
    target          text NOT NULL,
    objective_key   text NOT NULL,
    class           text REFERENCES ledger.campaign_class (name),
    status          text NOT NULL CHECK (status IN ('green', 'red')),
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    tick            timestamptz,
    details         jsonb NOT NULL DEFAULT '{}',
    campaign_id     bigint REFERENCES ledger.campaign (id),
    effect          text NOT NULL CHECK (effect IN ('opened', 'regressed', 'confirmed',
                                                    'dismissed', 'recorded')),
    idempotency_key text UNIQUE,
    request_digest  text,
    recorded_at     timestamptz NOT NULL,
    CONSTRAINT observation_one_per_tick UNIQUE (sensor, tick),
    CONSTRAINT observation_ordered CHECK (finished_at >= started_at)
);
CREATE INDEX observation_by_campaign ON ledger.observation (campaign_id, id);
CREATE INDEX observation_by_sensor ON ledger.observation (sensor, id DESC);

-- One row per claim. Its ending (outcome) is written once.
CREATE TABLE ledger.attempt (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id       bigint NOT NULL REFERENCES ledger.campaign (id),
    attempt_no        integer NOT NULL CHECK (attempt_no > 0),
    generation        bigint NOT NULL,
    worker            text NOT NULL,
    claimed_at        timestamptz NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    last_heartbeat_at timestamptz,
    heartbeat_count   integer NOT NULL DEFAULT 0,
    outcome           text NOT NULL DEFAULT 'running'
                      CHECK (outcome IN ('running', 'attempted', 'failed', 'lost',
                                         'drained', 'abandoned')),
    verdict           text CHECK (verdict IN ('accepted', 'rejected')),
    ended_at          timestamptz,
    failure_reason    text,
    fingerprint       text,
    base_sha          text,
    candidate_sha     text,
    bundle            jsonb,
    bundle_digest     text,
    log_tail          text,
    CONSTRAINT attempt_number_unique UNIQUE (campaign_id, attempt_no),
    CONSTRAINT attempt_generation_unique UNIQUE (campaign_id, generation),
    CONSTRAINT attempt_ended CHECK ((outcome = 'running') = (ended_at IS NULL)),
    CONSTRAINT attempt_verdict_after_record CHECK (verdict IS NULL OR outcome = 'attempted')
);
CREATE UNIQUE INDEX attempt_one_running ON ledger.attempt (campaign_id) WHERE outcome = 'running';
CREATE INDEX attempt_fingerprint ON ledger.attempt (campaign_id, fingerprint)
    WHERE fingerprint IS NOT NULL;

-- A verifier's check of one recorded attempt, with its own short lease.
CREATE TABLE ledger.verification (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id      bigint NOT NULL REFERENCES ledger.campaign (id),
    attempt_id       bigint NOT NULL REFERENCES ledger.attempt (id),
    generation       bigint NOT NULL,
    verifier         text NOT NULL,
    model_family     text,
    status           text NOT NULL DEFAULT 'running'
                     CHECK (status IN ('running', 'accepted', 'rejected', 'lost', 'abandoned')),
    claimed_at       timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    finished_at      timestamptz,
    reason           text,
    evidence         jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT verification_finished CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE UNIQUE INDEX verification_one_running ON ledger.verification (campaign_id)
    WHERE status = 'running';
CREATE INDEX verification_by_campaign ON ledger.verification (campaign_id, id);

-- The outbox: an intent is committed before its action happens.
CREATE TABLE ledger.side_effect (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id      bigint NOT NULL REFERENCES ledger.campaign (id),
    generation       bigint NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('git.update_ref', 'http.request')),
    purpose          text NOT NULL DEFAULT 'other' CHECK (purpose IN ('promotion', 'other')),
    target           text NOT NULL,
    precondition     jsonb NOT NULL DEFAULT '{}',
    payload          jsonb NOT NULL DEFAULT '{}',
    idempotency_key  text NOT NULL UNIQUE,
    requested_by     text NOT NULL,
    requested_role   text NOT NULL REFERENCES ledger.actor (name),
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'claimed', 'done', 'conflict', 'failed',
                                      'cancelled')),
    claimed_by       text,
    claim_token      bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    tries            integer NOT NULL DEFAULT 0,
    next_try_at      timestamptz NOT NULL,
    result           jsonb,
    error            text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    CONSTRAINT side_effect_claim CHECK ((state = 'claimed') = (claimed_by IS NOT NULL))
);
CREATE INDEX side_effect_open ON ledger.side_effect (next_try_at, id)
    WHERE state IN ('pending', 'claimed');
CREATE INDEX side_effect_by_campaign ON ledger.side_effect (campaign_id, id);

-- Refused writes. Written by functions that then return a refusal instead of
-- raising, so the record survives.
CREATE TABLE ledger.security_event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    actor_role  text NOT NULL,
    actor       text NOT NULL,
    campaign_id bigint REFERENCES ledger.campaign (id),
    action      text NOT NULL,
    target      text NOT NULL,
    reason      text NOT NULL,
    details     jsonb NOT NULL DEFAULT '{}'
);

-- The journal: append-only, one gap-free seq per campaign.
CREATE TABLE ledger.campaign_event (
    campaign_id bigint NOT NULL REFERENCES ledger.campaign (id),
    seq         bigint NOT NULL CHECK (seq > 0),
    type        text NOT NULL CHECK (type ~ '^[a-z][a-z0-9_.]{0,63}$'),
    actor       text NOT NULL,
    generation  bigint NOT NULL,
    -- deltas (output lines, progress) may be trimmed once the campaign is closed
    delta       boolean NOT NULL DEFAULT false,
    payload     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (campaign_id, seq)
);
CREATE INDEX campaign_event_recent ON ledger.campaign_event (created_at);
