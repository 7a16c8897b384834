-- 0008, before its schema files: approval before promotion (approval.sql).
-- Run as the owner.

-- state_machine.sql: the state awaiting_approval, shown after verified (the
-- positions are unique: moved out of the way, then back one further)
UPDATE ledger.state SET position = position + 100 WHERE position >= 5;
UPDATE ledger.state SET position = position - 99 WHERE position >= 100;
INSERT INTO ledger.state (name, is_terminal, position, description) VALUES
    ('awaiting_approval', false, 5, 'verified; its class asks a person before it is promoted (nothing is leased while it waits)');
INSERT INTO ledger.transition (name, from_state, to_state, owner_role, attempt_charge, note) VALUES
    ('request_approval', 'verified', 'awaiting_approval', 'system', 0, 'the class''s approval policy asks a person first (the conditions that asked are journaled); nothing is leased while it waits'),
    ('approve',        'awaiting_approval', 'verified', 'operator', 0, 'never by the identity that made the attempt: its promotion is queued'),
    ('deny',           'awaiting_approval', 'ready', 'operator', 0, 'never by the identity that made the attempt: the reason is shown to the next attempt as a rejection, the approach refused'),
    ('abandon',        'awaiting_approval', 'abandoned', 'operator', 0, 'bumps generation (a denial that stops the campaign)'),
    ('approve_on_timeout', 'awaiting_approval', 'verified', 'system', 0, 'no decision in time, and the class approves then: its promotion is queued'),
    ('deny_on_timeout', 'awaiting_approval', 'ready', 'system', 0, 'no decision in time: denied, as the class says'),
    ('abandon_on_timeout', 'awaiting_approval', 'abandoned', 'system', 0, 'no decision in time: abandoned, as the class says; bumps generation');

-- campaign.sql: the class's approval policy (every class there is: never)
ALTER TABLE ledger.campaign_class
    ADD COLUMN approval jsonb NOT NULL DEFAULT '{}'
        CONSTRAINT campaign_class_approval_check CHECK (jsonb_typeof(approval) = 'object');

-- Signatures that grow an argument (with a default: a 0.2.0 caller names
-- the ones it knows): the new ones are created by the schema files.
DROP FUNCTION ledger_api.claim_side_effect(text, double precision, text[]);
DROP FUNCTION ledger_api.register_class(text, integer, double precision, double precision,
                                        double precision, double precision, double precision, text,
                                        jsonb, jsonb, jsonb, text, integer, double precision, text[]);
