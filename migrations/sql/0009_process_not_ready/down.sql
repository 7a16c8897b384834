-- 0009 down: the registry without not_ready; process.sql, views.sql and
-- grants.sql as 0004 left them are put back after this.
DROP VIEW IF EXISTS ledger_api.processes;
DROP FUNCTION IF EXISTS ledger.report_process(text, text, integer, timestamptz, text, text,
                                              double precision, jsonb, boolean, text);
DROP FUNCTION IF EXISTS ledger_api.report_sensor_process(text, integer, timestamptz, text, text,
                                                         double precision, jsonb, boolean, text);
DROP FUNCTION IF EXISTS ledger_api.report_worker_process(text, integer, timestamptz, text, text,
                                                         double precision, jsonb, boolean, text);
DROP FUNCTION IF EXISTS ledger_api.report_reaper_process(text, integer, timestamptz, text, text,
                                                         double precision, jsonb, boolean, text);
DROP FUNCTION IF EXISTS ledger_api.report_verifier_process(text, integer, timestamptz, text, text,
                                                           double precision, jsonb, boolean, text);
DROP FUNCTION IF EXISTS ledger_api.report_dispatcher_process(text, integer, timestamptz, text, text,
                                                             double precision, jsonb, boolean, text);
DROP FUNCTION IF EXISTS ledger_api.report_operator_process(text, integer, timestamptz, text, text,
                                                           double precision, jsonb, boolean, text);
ALTER TABLE ledger.process DROP COLUMN IF EXISTS not_ready;
