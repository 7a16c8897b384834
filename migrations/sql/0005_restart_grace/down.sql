-- 0005 down: the grace goes; the previous copies of the functions that call
-- it are put back after this.
DROP FUNCTION IF EXISTS ledger.restart_grace();
DROP FUNCTION IF EXISTS ledger.server_incarnation();
DELETE FROM ledger.meta WHERE key = 'server_incarnation';
ALTER TABLE ledger.verification DROP COLUMN IF EXISTS lease_s;
