-- What the server itself reports.

-- name: notify_queue_usage
-- The share of the server's notification queue in use (0..1): it grows while
-- a session LISTENs but does not read.
SELECT pg_catalog.pg_notification_queue_usage() AS usage;
