-- 0004 down: no greeting; grants.sql as 0002 left it is put back after this.
DROP FUNCTION IF EXISTS ledger_api.hello(text, text);
DELETE FROM ledger.meta WHERE key = 'oldest_client';
