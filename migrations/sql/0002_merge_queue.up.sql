-- 0002 up: the merge queue's transition (mirrored in state_machine.sql).
INSERT INTO ledger.transition (name, from_state, to_state, owner_role, attempt_charge, note) VALUES
    ('requeue', 'attempted', 'verified', 'verifier', 0,
     'the merge queue''s stack of several candidates failed with this one on top: no verdict on it alone; back in the queue with its own candidate, nothing charged')
ON CONFLICT DO NOTHING;
