-- 0011, before its schema files: limits and budgets (limits.sql). Run as
-- the owner. Every class and campaign there is starts without limits: no
-- keys, no resources, no budget, nothing spent.

-- state_machine.sql: the state budget_exhausted, shown after exhausted (the
-- positions are unique: moved out of the way, then back one further)
UPDATE ledger.state SET position = position + 100 WHERE position >= 7;
UPDATE ledger.state SET position = position - 99 WHERE position >= 100;
INSERT INTO ledger.state (name, is_terminal, position, description) VALUES
    ('budget_exhausted', false, 7, 'its reported cost reached its budget (max_cost): not started again until an operator raises it');
INSERT INTO ledger.transition (name, from_state, to_state, owner_role, attempt_charge, note) VALUES
    ('exhaust_budget', 'ready',     'budget_exhausted', 'system', 0, 'its reported cost reached max_cost: not started again (the figures are journaled)'),
    ('raise_budget',   'budget_exhausted', 'ready', 'operator', 0, 'an operator raised max_cost above what was spent: attempted again'),
    ('abandon',        'budget_exhausted', 'abandoned', 'operator', 0, 'bumps generation');

-- campaign.sql: each class's limits, each campaign's keys, budget and spend
ALTER TABLE ledger.campaign_class
    ADD COLUMN limit_keys text[] NOT NULL DEFAULT '{}'
        CONSTRAINT campaign_class_limit_keys_check
        CHECK (cardinality(limit_keys) <= 16 AND array_position(limit_keys, NULL) IS NULL),
    ADD COLUMN resources text[] NOT NULL DEFAULT '{}'
        CONSTRAINT campaign_class_resources_check
        CHECK (cardinality(resources) <= 8 AND array_position(resources, NULL) IS NULL),
    ADD COLUMN max_cost numeric
        CONSTRAINT campaign_class_max_cost_check CHECK (max_cost > 0 AND max_cost <= 1000000000),
    ADD COLUMN fair_key text
        CONSTRAINT campaign_class_fair_key_check CHECK (fair_key ~ '^[a-z][a-z0-9_.-]{0,31}$');
ALTER TABLE ledger.campaign
    ADD COLUMN limit_keys text[] NOT NULL DEFAULT '{}',
    ADD COLUMN resources text[] NOT NULL DEFAULT '{}',
    ADD COLUMN max_cost numeric,
    ADD COLUMN cost_spent numeric NOT NULL DEFAULT 0,
    ADD COLUMN fair_key text,
    ADD COLUMN limit_shards smallint[];
