-- The reaper's API

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

-- Return expired leases to ready: housekeeping, not the fence (a holder
-- whose lease expired is refused by every write already). Expiry is
-- re-tested by the UPDATE itself: a lease renewed after the candidate list
-- was read (or while this statement waited for the row lock) is not reaped.
-- The lost attempt counts; the generation's pending intents are cancelled
-- (by the journal trigger). A restart of the database is first forgiven
-- (ledger.restart_grace): what lapsed while the server was down is not reaped.
CREATE OR REPLACE FUNCTION ledger_api.expire_leases(p_grace_s double precision DEFAULT 0,
                                                    p_limit integer DEFAULT 100)
    RETURNS TABLE (campaign_id bigint, generation bigint, worker text, state text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_cutoff timestamptz;
    v_ids bigint[];
BEGIN
    PERFORM ledger.check_range('grace_s', p_grace_s, 0, 86400);
    PERFORM ledger.check_range('limit', p_limit, 1, 10000);
    -- a lease that lapsed while the server itself was down is no lost worker:
    -- after a restart, every lease in flight first gets its length again
    PERFORM ledger.restart_grace();
    v_cutoff := v_now - make_interval(secs => p_grace_s);
    PERFORM ledger.begin_batch_transition('expire_lease', 'reaper', 'reaper',
                jsonb_build_object('reason', 'lease expired', 'grace_s', p_grace_s));
    WITH reaped AS (
        UPDATE ledger.campaign c
           SET state = 'ready', generation = c.generation + 1,
               lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
               attempt_count = c.attempt_count + 1, next_attempt_at = v_now,
               last_failure_reason = 'lease expired: the worker was lost'
         WHERE c.id = ANY (ARRAY(
                   SELECT e.id FROM ledger.campaign e
                    WHERE e.state = 'leased' AND e.lease_expires_at < v_cutoff
                    ORDER BY e.lease_expires_at
                    LIMIT p_limit))
           AND c.state = 'leased'
           AND c.lease_expires_at < v_cutoff
        RETURNING c.id
    )
    SELECT array_agg(r.id) INTO v_ids FROM reaped r;
    PERFORM ledger.end_transition();
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    UPDATE ledger.attempt a
       SET outcome = 'lost', ended_at = v_now, failure_reason = 'lease expired'
     WHERE a.campaign_id = ANY (v_ids) AND a.outcome = 'running';
    -- Those whose budget the lost attempt spent: exhausted, in one statement
    -- (exhaust_if_spent's rule, for the whole set).
    PERFORM ledger.begin_batch_transition('exhaust', 'system', 'system',
                                          jsonb_build_object('reason', 'attempts used up'));
    UPDATE ledger.campaign c SET state = 'exhausted'
     WHERE c.id = ANY (v_ids) AND c.state = 'ready' AND c.attempt_count >= c.max_attempts;
    PERFORM ledger.end_transition();
    RETURN QUERY
        SELECT c.id, c.generation, a.worker, c.state
          FROM ledger.campaign c
          JOIN ledger.attempt a ON a.campaign_id = c.id AND a.generation = c.generation - 1
         WHERE c.id = ANY (v_ids);
END
$$;

-- Decide the approvals whose deadline passed (approval.sql), as each one's
-- class said when it was asked for: deny (back to ready), abandon, or
-- approve (its promotion requested). The system's decision, journaled as
-- such. A campaign another transaction holds is left for the next pass
-- (SKIP LOCKED); so is a deadline not yet passed at the instant of the
-- write (re-tested under the lock).
CREATE OR REPLACE FUNCTION ledger_api.expire_approvals(p_limit integer DEFAULT 100)
    RETURNS TABLE (campaign_id bigint, approval_id bigint, decision text, state text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_ap ledger.approval;
    v_state text;
BEGIN
    PERFORM ledger.check_range('limit', p_limit, 1, 10000);
    FOR v_c IN
        SELECT c.* FROM ledger.campaign c
         WHERE c.id IN (SELECT ap.campaign_id FROM ledger.approval ap
                         WHERE ap.decision IS NULL AND ap.deadline <= v_now
                         ORDER BY ap.deadline LIMIT p_limit)
           AND c.state = 'awaiting_approval'
         ORDER BY c.id
           FOR UPDATE OF c SKIP LOCKED
    LOOP
        SELECT * INTO v_ap FROM ledger.approval ap
         WHERE ap.campaign_id = v_c.id AND ap.decision IS NULL AND ap.deadline <= v_now FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_state := ledger.decide_approval(
            v_c, v_ap, v_ap.on_timeout, v_ap.on_timeout || '_on_timeout', 'system', 'system',
            format('no decision within %s s of the request (the class %s on timeout)',
                   round(extract(epoch FROM v_ap.deadline - v_ap.requested_at)::numeric, 3),
                   CASE v_ap.on_timeout WHEN 'approve' THEN 'approves' WHEN 'abandon' THEN 'abandons'
                                        ELSE 'denies' END));
        RETURN QUERY SELECT v_c.id, v_ap.id,
            CASE v_ap.on_timeout WHEN 'approve' THEN 'approved' WHEN 'abandon' THEN 'abandoned'
                                 ELSE 'denied' END, v_state;
    END LOOP;
END
$$;
