-- 0009, before the schema files: the registry's new column, and the report
-- functions' old signatures (each gains p_not_ready: a new argument list is a
-- new function, so the old one goes first). Run as the owner.
ALTER TABLE ledger.process
    ADD COLUMN IF NOT EXISTS not_ready text
        CONSTRAINT process_not_ready_check CHECK (length(not_ready) BETWEEN 1 AND 1000);

DROP FUNCTION IF EXISTS ledger.report_process(text, text, integer, timestamptz, text, text,
                                              double precision, jsonb, boolean);
DROP FUNCTION IF EXISTS ledger_api.report_sensor_process(text, integer, timestamptz, text, text,
                                                         double precision, jsonb, boolean);
DROP FUNCTION IF EXISTS ledger_api.report_worker_process(text, integer, timestamptz, text, text,
                                                         double precision, jsonb, boolean);
DROP FUNCTION IF EXISTS ledger_api.report_reaper_process(text, integer, timestamptz, text, text,
                                                         double precision, jsonb, boolean);
DROP FUNCTION IF EXISTS ledger_api.report_verifier_process(text, integer, timestamptz, text, text,
                                                           double precision, jsonb, boolean);
DROP FUNCTION IF EXISTS ledger_api.report_dispatcher_process(text, integer, timestamptz, text, text,
                                                             double precision, jsonb, boolean);
DROP FUNCTION IF EXISTS ledger_api.report_operator_process(text, integer, timestamptz, text, text,
                                                           double precision, jsonb, boolean);
