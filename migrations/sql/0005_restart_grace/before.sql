-- 0005, before its schema files: the length of a verification's lease (set by
-- its claim and each heartbeat from now on; NULL for those in flight: 120 s).
ALTER TABLE ledger.verification ADD COLUMN lease_s double precision;
