-- The merge queue (docs/merge-queue.md): verified candidates for one promotion target
-- wait in order, and a target that moved is caught up with by a batch.
--
-- Every promotion intent enters its target's queue (one row per campaign,
-- keeping its place while the campaign is re-stacked or re-queued). The
-- outbox gives out a promotion only in its turn (ledger.merge_queue_turn):
-- the head of the queue when no batch is open, else the batch's probe. A
-- head whose target did not move lands as before. When the target moved,
-- the dispatcher stacks the next candidates onto it (each one's own change
-- replayed onto the one below, in the object database) and records the
-- batch (merge_queue_stack): the top member -- the probe -- is rebased onto
-- the stack below it (transition rebase) and verified like any rebased
-- candidate; the others keep their verdicts and wait, held. One verification
-- of the probe covers the whole stack:
--   accepted  the batch lands (merge_queue_freeze, the compare-and-swap,
--             merge_queue_landed): one commit per member, each with its own
--             trailers, every member's intent done exactly once;
--   rejected  with others below it, no verdict on the probe alone
--             (transition requeue: back to verified with its own candidate,
--             nothing charged) and the next batch is half as long (a
--             bisection); alone on the target, an ordinary rejection.
-- The culprit is thus always rejected by a verification of its own change
-- on the target with everything ahead of it landed.

CREATE SEQUENCE IF NOT EXISTS ledger.merge_queue_position;

CREATE TABLE IF NOT EXISTS ledger.merge_queue (
    campaign_id bigint PRIMARY KEY REFERENCES ledger.campaign (id),
    repository  text NOT NULL,
    ref         text NOT NULL,
    -- the order of first verification, kept through re-stacking
    position    bigint NOT NULL DEFAULT nextval('ledger.merge_queue_position'),
    queued_at   timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS merge_queue_order ON ledger.merge_queue (repository, ref, position);

CREATE TABLE IF NOT EXISTS ledger.merge_batch (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    repository       text NOT NULL,
    ref              text NOT NULL,
    base_sha         text NOT NULL,      -- the target the stack was built on
    members          bigint[] NOT NULL,  -- campaigns, bottom of the stack first; the last is the probe
    generations      bigint[] NOT NULL,  -- each member's generation as stacked (the probe's before its rebase)
    stack            text[] NOT NULL,    -- member i's change on stack[i-1] (stack[0]: base_sha)
    -- per member, its own change and verdict as its intent had them:
    -- {old, new, candidate_ref, landing}
    changes          jsonb NOT NULL,
    probe_generation bigint NOT NULL,    -- the probe's generation after its rebase
    -- bisecting: the culprit lies within the first `suspect` candidates of
    -- the queue when this batch was formed (NULL: nothing suspected)
    suspect          integer CHECK (suspect >= 1),
    landed           text[],             -- the commits that land, frozen before the push
    state            text NOT NULL DEFAULT 'verifying'
                     CHECK (state IN ('verifying', 'landing', 'landed', 'failed', 'dissolved')),
    reason           text,
    created_at       timestamptz NOT NULL,
    closed_at        timestamptz,
    CONSTRAINT merge_batch_shape CHECK (
        cardinality(members) >= 1 AND cardinality(generations) = cardinality(members)
        AND cardinality(stack) = cardinality(members)
        AND jsonb_array_length(changes) = cardinality(members)
        AND (landed IS NULL OR cardinality(landed) = cardinality(members))),
    CONSTRAINT merge_batch_closed CHECK ((state IN ('verifying', 'landing')) = (closed_at IS NULL))
);
-- One open batch per target: a second would be stacked on a target the first moves.
CREATE UNIQUE INDEX IF NOT EXISTS merge_batch_one_open ON ledger.merge_batch (repository, ref)
    WHERE state IN ('verifying', 'landing');
CREATE INDEX IF NOT EXISTS merge_batch_by_target ON ledger.merge_batch (repository, ref, id);

-- A promotion intent queues its campaign (once: a re-stacked or re-queued
-- campaign keeps its place).
CREATE OR REPLACE FUNCTION ledger.merge_queue_enter() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.purpose = 'promotion' AND NEW.kind = 'git.update_ref' THEN
        INSERT INTO ledger.merge_queue (campaign_id, repository, ref, queued_at)
        VALUES (NEW.campaign_id, coalesce(NEW.payload ->> 'repository', ''), NEW.target, ledger.now())
        ON CONFLICT (campaign_id) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER side_effect_merge_queue_enter
    AFTER INSERT ON ledger.side_effect
    FOR EACH ROW EXECUTE FUNCTION ledger.merge_queue_enter();

-- A landed promotion leaves the queue.
CREATE OR REPLACE FUNCTION ledger.merge_queue_landed_leaves() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.purpose = 'promotion' AND NEW.state = 'done' AND OLD.state <> 'done' THEN
        DELETE FROM ledger.merge_queue q WHERE q.campaign_id = NEW.campaign_id;
        -- a batch of one whose probe landed as a plain promotion (its target
        -- was where the stack was built) is over
        UPDATE ledger.merge_batch b
           SET state = 'landed', landed = ARRAY[coalesce(NEW.result ->> 'landed', NEW.payload ->> 'new')],
               closed_at = ledger.now()
         WHERE b.state IN ('verifying', 'landing') AND cardinality(b.members) = 1
           AND b.members[1] = NEW.campaign_id AND b.probe_generation = NEW.generation;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER side_effect_merge_queue_leave
    AFTER UPDATE OF state ON ledger.side_effect
    FOR EACH ROW EXECUTE FUNCTION ledger.merge_queue_landed_leaves();

-- A campaign that is no longer on its way to its target (rejected, sent back
-- for a new attempt, abandoned, closed) leaves the queue, and the open batch
-- it is in ends: one that was alone on the target and rejected has found its
-- culprit ('failed'); any other loses a change its stack holds ('dissolved':
-- its members wait again, to be stacked anew).
CREATE OR REPLACE FUNCTION ledger.merge_queue_campaign_moved() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.state IN ('attempted', 'verified') AND NEW.state IS NOT DISTINCT FROM OLD.state THEN
        RETURN NULL;
    END IF;
    IF NEW.state NOT IN ('attempted', 'verified') THEN
        DELETE FROM ledger.merge_queue q WHERE q.campaign_id = NEW.id;
        UPDATE ledger.merge_batch b
           SET state = CASE WHEN cardinality(b.members) = 1 AND NEW.state IN ('ready', 'exhausted')
                            THEN 'failed' ELSE 'dissolved' END,
               reason = format('campaign %s left the queue (%s)', NEW.id, NEW.state),
               closed_at = ledger.now()
         WHERE b.state = 'verifying' AND NEW.id = ANY (b.members);
    END IF;
    RETURN NULL;
END
$$;

-- (Only what leaves attempted or verified can be queued or stacked: the
-- WHEN spares every claim and every recorded attempt the call.)
CREATE OR REPLACE TRIGGER campaign_merge_queue
    AFTER UPDATE OF state ON ledger.campaign
    FOR EACH ROW
    WHEN (OLD.state IN ('attempted', 'verified') AND NEW.state NOT IN ('attempted', 'verified'))
    EXECUTE FUNCTION ledger.merge_queue_campaign_moved();

-- Whether the outbox may give out this intent now. Anything but a queued
-- promotion: always. A queued promotion: the probe of its target's open
-- batch (at the probe's generation), or, with no batch open, the head of
-- the queue (the verified, unpromoted campaign first in line).
CREATE OR REPLACE FUNCTION ledger.merge_queue_turn(p_s ledger.side_effect)
    RETURNS boolean
    LANGUAGE sql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN p_s.purpose <> 'promotion' OR q.campaign_id IS NULL THEN true
        WHEN b.id IS NOT NULL THEN b.members[cardinality(b.members)] = p_s.campaign_id
                                   AND b.probe_generation = p_s.generation
        ELSE NOT EXISTS (SELECT 1 FROM ledger.merge_queue a
                           JOIN ledger.campaign c ON c.id = a.campaign_id
                          WHERE a.repository = q.repository AND a.ref = q.ref
                            AND a.position < q.position
                            AND c.state = 'verified' AND c.promoted_at IS NULL)
    END
      FROM (SELECT 1) one
      LEFT JOIN ledger.merge_queue q ON q.campaign_id = p_s.campaign_id
      LEFT JOIN ledger.merge_batch b ON b.repository = q.repository AND b.ref = q.ref
                                    AND b.state IN ('verifying', 'landing')
$$;

-- The queue knobs of a class (promotion.merge_queue), range-checked.
CREATE OR REPLACE FUNCTION ledger.merge_queue_policy(p_class text)
    RETURNS jsonb
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb;
    v_size integer;
    v_wait double precision;
BEGIN
    SELECT coalesce(cc.promotion -> 'merge_queue', '{}') INTO v
      FROM ledger.campaign_class cc WHERE cc.name = p_class;
    v_size := coalesce((v ->> 'batch_size')::integer, 8);
    v_wait := coalesce((v ->> 'max_wait_s')::double precision, 0);
    PERFORM ledger.check_range('batch_size', v_size, 1, 64);
    PERFORM ledger.check_range('max_wait_s', v_wait, 0, 3600);
    RETURN jsonb_build_object('batch_size', v_size, 'max_wait_s', v_wait);
END
$$;

-- A member's own change: what its live intent says, or -- for a probe whose
-- batch ended before it landed -- what it was before it was stacked.
CREATE OR REPLACE FUNCTION ledger.merge_queue_change(p_campaign_id bigint, p_s ledger.side_effect)
    RETURNS jsonb
    LANGUAGE sql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(
        (SELECT b.changes -> (cardinality(b.members) - 1)
           FROM ledger.merge_batch b
          WHERE b.members[cardinality(b.members)] = p_campaign_id
            AND b.probe_generation = p_s.generation AND b.state IN ('failed', 'dissolved')
          ORDER BY b.id DESC LIMIT 1),
        jsonb_build_object('old', p_s.precondition ->> 'old', 'new', p_s.payload ->> 'new',
                           'candidate_ref', p_s.payload ->> 'candidate_ref',
                           'landing', p_s.payload -> 'landing'))
$$;

-- What a dispatcher holding a promotion's claim needs to act on its queue:
-- the open batch (if any), the queue in order (each waiting member with its
-- intent and own change, up to p_limit), the last closed batch (for the
-- bisection) and the class's knobs. NULL when the intent is not queued.
CREATE OR REPLACE FUNCTION ledger_api.merge_queue_view(p_side_effect_id bigint, p_claim_token bigint,
                                                       p_limit integer DEFAULT 64)
    RETURNS jsonb
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_s ledger.side_effect;
    v_q ledger.merge_queue;
    v_class text;
BEGIN
    PERFORM ledger.check_range('limit', p_limit, 1, 1000);
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id;
    IF NOT FOUND OR v_s.claim_token <> p_claim_token OR v_s.state <> 'claimed' THEN
        RAISE EXCEPTION 'side effect % is not claimed with this token', p_side_effect_id
            USING ERRCODE = 'LG001';
    END IF;
    SELECT * INTO v_q FROM ledger.merge_queue q WHERE q.campaign_id = v_s.campaign_id;
    IF NOT FOUND OR v_s.purpose <> 'promotion' THEN
        RETURN NULL;
    END IF;
    SELECT c.class INTO v_class FROM ledger.campaign c WHERE c.id = v_s.campaign_id;
    RETURN jsonb_build_object(
        'policy', ledger.merge_queue_policy(v_class),
        'now', ledger.now(),
        'batch', (SELECT to_jsonb(b) FROM ledger.merge_batch b
                   WHERE b.repository = v_q.repository AND b.ref = v_q.ref
                     AND b.state IN ('verifying', 'landing')),
        'last', (SELECT to_jsonb(b) FROM ledger.merge_batch b
                  WHERE b.repository = v_q.repository AND b.ref = v_q.ref
                    AND b.state IN ('landed', 'failed', 'dissolved')
                  ORDER BY b.id DESC LIMIT 1),
        'queue', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'campaign_id', w.campaign_id, 'generation', w.generation,
                       'side_effect_id', w.id, 'queued_at', w.queued_at,
                       'change', w.change) ORDER BY w.position)
              FROM (SELECT q.campaign_id, q.position, q.queued_at, s.id, s.generation,
                           ledger.merge_queue_change(q.campaign_id, s) AS change
                      FROM ledger.merge_queue q
                      JOIN ledger.campaign c ON c.id = q.campaign_id
                      JOIN ledger.side_effect s
                        ON s.campaign_id = c.id AND s.generation = c.generation
                       AND s.purpose = 'promotion' AND s.state IN ('pending', 'claimed')
                     WHERE q.repository = v_q.repository AND q.ref = v_q.ref
                       AND c.state = 'verified' AND c.promoted_at IS NULL
                     ORDER BY q.position
                     LIMIT p_limit) w), '[]'));
END
$$;

-- The internal rebase of a verified campaign's promotion (rebase_promotion
-- and the merge queue's probe): its intent is ended as a conflict, the
-- campaign goes back to attempted at the next generation with the rebased
-- candidate as an attempt of its own (made by the dispatcher, not charged).
CREATE OR REPLACE FUNCTION ledger.rebase_verified(
        p_c ledger.campaign, p_s ledger.side_effect, p_actor text, p_base_sha text,
        p_candidate_sha text, p_bundle jsonb, p_bundle_digest text, p_evidence_location text,
        p_diff bytea, p_candidate_ref text, p_why text)
    RETURNS integer
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_a ledger.attempt;
    v_attempt_no integer;
BEGIN
    IF p_candidate_sha IS NULL OR p_candidate_sha !~ '^[0-9a-f]{7,64}$'
       OR p_base_sha IS NULL OR p_base_sha !~ '^[0-9a-f]{7,64}$' THEN
        RAISE EXCEPTION 'candidate and base must be hexadecimal commit ids' USING ERRCODE = 'LG007';
    END IF;
    IF p_bundle IS NULL OR jsonb_typeof(p_bundle) <> 'object' OR coalesce(p_bundle_digest, '') = '' THEN
        RAISE EXCEPTION 'a rebased candidate needs its frozen bundle and digest'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_s.purpose <> 'promotion' OR p_c.state <> 'verified' OR p_c.generation <> p_s.generation THEN
        RAISE EXCEPTION 'side effect % is not the live promotion of campaign % (it is %, generation %)',
            p_s.id, p_c.id, p_c.state, p_c.generation USING ERRCODE = 'LG002';
    END IF;
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = p_c.id AND a.generation = p_c.generation;
    SELECT max(a.attempt_no) + 1 INTO v_attempt_no FROM ledger.attempt a WHERE a.campaign_id = p_c.id;
    IF (p_bundle ->> 'attempt_no')::integer IS DISTINCT FROM v_attempt_no
       OR (p_bundle ->> 'generation')::bigint IS DISTINCT FROM p_c.generation + 1
       OR (p_bundle ->> 'candidate_sha') IS DISTINCT FROM p_candidate_sha THEN
        RAISE EXCEPTION 'the bundle must describe attempt % at generation % with candidate %',
            v_attempt_no, p_c.generation + 1, p_candidate_sha USING ERRCODE = 'LG007';
    END IF;
    UPDATE ledger.side_effect s
       SET state = 'conflict', claimed_by = NULL, lease_expires_at = NULL,
           result = jsonb_build_object('rebased_onto', p_base_sha, 'candidate', p_candidate_sha),
           error = p_why, finished_at = v_now, updated_at = v_now
     WHERE s.id = p_s.id;
    PERFORM ledger.begin_transition('rebase', 'dispatcher', p_actor,
                jsonb_build_object('side_effect_id', p_s.id, 'attempt_no', v_attempt_no,
                                   'from_candidate', v_a.candidate_sha, 'candidate_sha', p_candidate_sha,
                                   'base_sha', p_base_sha));
    UPDATE ledger.campaign c
       SET state = 'attempted', generation = c.generation + 1,
           promoted_at = NULL, promoted_sha = NULL,
           evidence_location = coalesce(p_evidence_location, c.evidence_location),
           last_failure_reason = NULL
     WHERE c.id = p_c.id;
    PERFORM ledger.end_transition();
    INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker, claimed_at, lease_expires_at,
                                outcome, ended_at, fingerprint, base_sha, candidate_sha, bundle,
                                bundle_digest, log_tail, diff, candidate_ref)
    VALUES (p_c.id, v_attempt_no, p_c.generation + 1, p_actor, v_now, v_now,
            'attempted', v_now, v_a.fingerprint, p_base_sha, p_candidate_sha, p_bundle,
            p_bundle_digest, format('rebased from %s onto %s', v_a.candidate_sha, p_base_sha),
            p_diff, p_candidate_ref);
    PERFORM pg_notify('ledger_attempted', p_c.id::text);
    RETURN v_attempt_no;
END
$$;

-- The claimed head's target moved: record the batch stacked onto it and
-- send its probe (the last member) to be verified. The head's claim is given
-- back (its intent waits, held, unless it is the probe itself). Every member
-- must be verified, unpromoted, at the generation it was stacked at, with
-- its promotion pending (the head's: claimed by this dispatcher).
CREATE OR REPLACE FUNCTION ledger_api.merge_queue_stack(
        p_side_effect_id bigint, p_claim_token bigint, p_base_sha text,
        p_members bigint[], p_generations bigint[], p_stack text[], p_changes jsonb,
        p_suspect integer, p_bundle jsonb, p_bundle_digest text, p_diff bytea,
        p_candidate_ref text)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_s ledger.side_effect;
    v_head ledger.side_effect;
    v_c ledger.campaign;
    v_n integer := cardinality(p_members);
    v_probe ledger.campaign;
    v_probe_s ledger.side_effect;
    v_id bigint;
BEGIN
    IF p_side_effect_id IS NULL OR p_claim_token IS NULL OR p_base_sha IS NULL THEN
        RAISE EXCEPTION 'a side effect id, claim token and base are required' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('members', coalesce(v_n, 0), 1, 64);
    IF cardinality(p_generations) IS DISTINCT FROM v_n OR cardinality(p_stack) IS DISTINCT FROM v_n
       OR jsonb_typeof(p_changes) IS DISTINCT FROM 'array' OR jsonb_array_length(p_changes) <> v_n
       OR EXISTS (SELECT 1 FROM unnest(p_stack) x WHERE x IS NULL OR x !~ '^[0-9a-f]{40}([0-9a-f]{24})?$') THEN
        RAISE EXCEPTION 'a batch needs one generation, stacked commit and change per member'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_suspect IS NOT NULL THEN
        PERFORM ledger.check_range('suspect', p_suspect, 1, 1000);
    END IF;
    -- lock order: campaigns (by id), then side effects (as abandon does)
    PERFORM 1 FROM ledger.campaign c WHERE c.id = ANY (p_members) ORDER BY c.id FOR UPDATE;
    SELECT * INTO v_head FROM ledger.side_effect s WHERE s.id = p_side_effect_id FOR UPDATE;
    IF NOT FOUND OR v_head.state <> 'claimed' OR v_head.claim_token <> p_claim_token
       OR v_head.lease_expires_at <= v_now THEN
        RAISE EXCEPTION 'side effect % is no longer claimed by this dispatcher', p_side_effect_id
            USING ERRCODE = 'LG001';
    END IF;
    IF v_head.campaign_id <> p_members[1] THEN
        RAISE EXCEPTION 'the claimed promotion (campaign %) must be the bottom of the stack',
            v_head.campaign_id USING ERRCODE = 'LG007';
    END IF;
    FOR i IN 1..v_n LOOP
        SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_members[i];
        SELECT * INTO v_s FROM ledger.side_effect s
         WHERE s.campaign_id = p_members[i] AND s.generation = p_generations[i]
           AND s.purpose = 'promotion' AND s.state IN ('pending', 'claimed')
         ORDER BY s.id DESC LIMIT 1;
        IF v_c.id IS NULL OR v_c.state <> 'verified' OR v_c.generation <> p_generations[i]
           OR v_c.promoted_at IS NOT NULL OR v_s.id IS NULL
           OR (v_s.state = 'claimed' AND v_s.id <> v_head.id)
           OR NOT EXISTS (SELECT 1 FROM ledger.merge_queue q WHERE q.campaign_id = v_c.id) THEN
            RAISE EXCEPTION 'campaign % is not waiting in the queue at generation %',
                p_members[i], p_generations[i] USING ERRCODE = 'LG002';
        END IF;
        IF i = v_n THEN
            v_probe := v_c;
            v_probe_s := v_s;
        END IF;
    END LOOP;
    INSERT INTO ledger.merge_batch (repository, ref, base_sha, members, generations, stack, changes,
                                    probe_generation, suspect, created_at)
    SELECT q.repository, q.ref, p_base_sha, p_members, p_generations, p_stack, p_changes,
           v_probe.generation + 1, p_suspect, v_now
      FROM ledger.merge_queue q WHERE q.campaign_id = p_members[1]
    RETURNING id INTO v_id;
    IF v_head.id <> v_probe_s.id THEN
        -- the head waits, held by the batch; this claim was no try
        UPDATE ledger.side_effect s
           SET state = 'pending', claimed_by = NULL, lease_expires_at = NULL,
               tries = greatest(s.tries - 1, 0), updated_at = v_now
         WHERE s.id = v_head.id;
    END IF;
    PERFORM ledger.rebase_verified(v_probe, v_probe_s, v_head.claimed_by,
                                   CASE WHEN v_n = 1 THEN p_base_sha ELSE p_stack[v_n - 1] END,
                                   p_stack[v_n], p_bundle, p_bundle_digest, NULL, p_diff,
                                   p_candidate_ref,
                                   format('the target moved: stacked %s of %s in merge batch %s and sent to be verified',
                                          v_n, v_n, v_id));
    RETURN v_id;
END
$$;

-- The probe was accepted: freeze the commits that land (intents first).
-- Every member must still be verified at its generation (the probe at the
-- probe generation) and the probe's intent claimed by this dispatcher; a
-- member that left ends the batch ('dissolved', false returned: nothing is
-- carried out). A retry of the same freeze returns true.
CREATE OR REPLACE FUNCTION ledger_api.merge_queue_freeze(p_batch_id bigint, p_side_effect_id bigint,
                                                         p_claim_token bigint, p_landed text[])
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_b ledger.merge_batch;
    v_s ledger.side_effect;
    v_gone bigint;
BEGIN
    PERFORM 1 FROM ledger.campaign c
      WHERE c.id = ANY ((SELECT b.members FROM ledger.merge_batch b WHERE b.id = p_batch_id)::bigint[])
      ORDER BY c.id FOR UPDATE;
    SELECT * INTO v_b FROM ledger.merge_batch b WHERE b.id = p_batch_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'merge batch % does not exist', p_batch_id USING ERRCODE = 'LG004';
    END IF;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id FOR UPDATE;
    IF NOT FOUND OR v_s.state <> 'claimed' OR v_s.claim_token <> p_claim_token
       OR v_s.lease_expires_at <= v_now THEN
        RAISE EXCEPTION 'side effect % is no longer claimed by this dispatcher', p_side_effect_id
            USING ERRCODE = 'LG001';
    END IF;
    IF v_s.campaign_id <> v_b.members[cardinality(v_b.members)] OR v_s.generation <> v_b.probe_generation THEN
        RAISE EXCEPTION 'side effect % is not the promotion of batch %''s probe', p_side_effect_id, p_batch_id
            USING ERRCODE = 'LG007';
    END IF;
    IF cardinality(p_landed) IS DISTINCT FROM cardinality(v_b.members)
       OR EXISTS (SELECT 1 FROM unnest(p_landed) x WHERE x IS NULL OR x !~ '^[0-9a-f]{40}([0-9a-f]{24})?$') THEN
        RAISE EXCEPTION 'one landed commit per member is required' USING ERRCODE = 'LG007';
    END IF;
    IF v_b.state = 'landing' THEN
        IF v_b.landed = p_landed THEN
            RETURN true;
        END IF;
        RAISE EXCEPTION 'merge batch % is landing other commits', p_batch_id USING ERRCODE = 'LG002';
    END IF;
    IF v_b.state <> 'verifying' THEN
        RETURN false;
    END IF;
    SELECT m.id INTO v_gone
      FROM unnest(v_b.members, v_b.generations) WITH ORDINALITY AS m(id, generation, n)
      LEFT JOIN ledger.campaign c ON c.id = m.id
     WHERE c.state IS DISTINCT FROM 'verified' OR c.promoted_at IS NOT NULL
        OR c.generation <> CASE WHEN m.n = cardinality(v_b.members) THEN v_b.probe_generation
                                ELSE m.generation END
     LIMIT 1;
    IF v_gone IS NOT NULL THEN
        UPDATE ledger.merge_batch b
           SET state = 'dissolved', closed_at = v_now,
               reason = format('campaign %s is no longer waiting at its generation', v_gone)
         WHERE b.id = v_b.id;
        RETURN false;
    END IF;
    UPDATE ledger.merge_batch b SET state = 'landing', landed = p_landed WHERE b.id = v_b.id;
    RETURN true;
END
$$;

-- The target was read back at the batch's top: every member's promotion is
-- done, once, with the commit that landed for it (its own, with its own
-- trailers), and the campaigns are promoted. Needs the probe's live claim;
-- a member that was abandoned after the freeze still had its commit land:
-- its intent is recorded done, its sealed journal is left alone.
CREATE OR REPLACE FUNCTION ledger_api.merge_queue_landed(p_batch_id bigint, p_side_effect_id bigint,
                                                         p_claim_token bigint, p_read_back text,
                                                         p_dispatcher text)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_b ledger.merge_batch;
    v_s ledger.side_effect;
    v_c ledger.campaign;
    v_n integer;
    v_generation bigint;
    v_result jsonb;
    v_landed integer := 0;
BEGIN
    PERFORM 1 FROM ledger.campaign c
      WHERE c.id = ANY ((SELECT b.members FROM ledger.merge_batch b WHERE b.id = p_batch_id)::bigint[])
      ORDER BY c.id FOR UPDATE;
    SELECT * INTO v_b FROM ledger.merge_batch b WHERE b.id = p_batch_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'merge batch % does not exist', p_batch_id USING ERRCODE = 'LG004';
    END IF;
    v_n := cardinality(v_b.members);
    IF v_b.state = 'landed' THEN
        RETURN v_n;  -- this very record, retried
    END IF;
    IF v_b.state <> 'landing' OR p_read_back IS DISTINCT FROM v_b.landed[v_n] THEN
        RAISE EXCEPTION 'merge batch % is %, and its top % is not what was read back (%)',
            p_batch_id, v_b.state, v_b.landed[v_n], p_read_back USING ERRCODE = 'LG002';
    END IF;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id FOR UPDATE;
    IF NOT FOUND OR v_s.state <> 'claimed' OR v_s.claim_token <> p_claim_token
       OR v_s.lease_expires_at <= v_now OR v_s.campaign_id <> v_b.members[v_n] THEN
        RAISE EXCEPTION 'side effect % is no longer claimed by this dispatcher', p_side_effect_id
            USING ERRCODE = 'LG001';
    END IF;
    FOR i IN 1..v_n LOOP
        v_generation := CASE WHEN i = v_n THEN v_b.probe_generation ELSE v_b.generations[i] END;
        SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_b.members[i];
        v_result := jsonb_build_object('landed', v_b.landed[i], 'candidate', v_b.stack[i],
                                       'read_back', p_read_back, 'merge_batch', v_b.id,
                                       'batch_position', i, 'batch_size', v_n,
                                       'dispatcher', p_dispatcher);
        WITH done AS (
            UPDATE ledger.side_effect s
               SET state = 'done', claimed_by = NULL, lease_expires_at = NULL, result = v_result,
                   error = NULL, finished_at = v_now, updated_at = v_now
             WHERE s.campaign_id = v_c.id AND s.generation = v_generation AND s.purpose = 'promotion'
               AND s.state IN ('pending', 'claimed')
               AND (s.state = 'pending' OR s.id = v_s.id)
            RETURNING s.id, s.kind, s.target)
        SELECT jsonb_build_object('side_effect_id', d.id, 'kind', d.kind, 'target', d.target,
                                  'result', v_result, 'error', NULL)
          INTO v_result FROM done d;
        CONTINUE WHEN v_result IS NULL;  -- cancelled meanwhile (abandoned): its journal is sealed
        v_landed := v_landed + 1;
        IF v_c.state = 'verified' AND v_c.generation = v_generation THEN
            PERFORM ledger.append_event(v_c.id, 'side_effect.done', p_dispatcher, v_result);
            UPDATE ledger.campaign c
               SET promoted_at = v_now, promoted_sha = v_b.landed[i],
                   waiting_on = NULL, waiting_reason = NULL, waiting_since = NULL, fault_count = 0
             WHERE c.id = v_c.id;
        END IF;
    END LOOP;
    UPDATE ledger.merge_batch b SET state = 'landed', closed_at = v_now WHERE b.id = v_b.id;
    RETURN v_landed;
END
$$;

-- The target moved under a batch that was landing or verifying (someone
-- outside the queue pushed): the batch ends, nothing is carried out, its
-- members wait to be stacked anew. Needs the probe's live claim.
CREATE OR REPLACE FUNCTION ledger_api.merge_queue_dissolve(p_batch_id bigint, p_side_effect_id bigint,
                                                           p_claim_token bigint, p_reason text)
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_s ledger.side_effect;
BEGIN
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id;
    IF NOT FOUND OR v_s.state <> 'claimed' OR v_s.claim_token <> p_claim_token
       OR v_s.lease_expires_at <= ledger.now() THEN
        RAISE EXCEPTION 'side effect % is no longer claimed by this dispatcher', p_side_effect_id
            USING ERRCODE = 'LG001';
    END IF;
    UPDATE ledger.merge_batch b
       SET state = 'dissolved', closed_at = ledger.now(), reason = left(coalesce(p_reason, 'dissolved'), 4000)
     WHERE b.id = p_batch_id AND b.state IN ('verifying', 'landing')
       AND b.members[cardinality(b.members)] = v_s.campaign_id;
END
$$;

-- Called by reject: the verification judged a batch's probe with others
-- below it. The stack failed, which says nothing of the probe alone: the
-- verdict is recorded as the stack's, the probe goes back to verified with
-- its own candidate and its place in the queue (transition requeue, nothing
-- charged, its approach not refused), and the batch fails, so the next one
-- is half as long. Returns false (an ordinary rejection follows) otherwise.
CREATE OR REPLACE FUNCTION ledger.merge_queue_requeue(p_v ledger.verification, p_reason text,
                                                      p_evidence jsonb)
    RETURNS boolean
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_b ledger.merge_batch;
    v_change jsonb;
    v_effect bigint;
    v_c ledger.campaign;
    v_a ledger.attempt;
BEGIN
    -- a probe verified on a stack that was dissolved meanwhile (a member
    -- left) was judged on a combination that will never land: no verdict either
    SELECT * INTO v_b FROM ledger.merge_batch b
     WHERE b.state IN ('verifying', 'dissolved') AND b.members[cardinality(b.members)] = p_v.campaign_id
       AND b.probe_generation = p_v.generation
     ORDER BY b.id DESC LIMIT 1
     FOR UPDATE;
    IF NOT FOUND OR (cardinality(v_b.members) < 2 AND v_b.state = 'verifying') THEN
        RETURN false;
    END IF;
    v_change := v_b.changes -> (cardinality(v_b.members) - 1);
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_v.campaign_id;
    SELECT * INTO v_a FROM ledger.attempt a WHERE a.id = p_v.attempt_id;
    UPDATE ledger.verification v
       SET status = 'rejected', finished_at = v_now, reason = left(p_reason, 4000),
           evidence = coalesce(p_evidence, '{}')
                      || jsonb_build_object('merge_batch', v_b.id, 'batch_size', cardinality(v_b.members))
     WHERE v.id = p_v.id;
    UPDATE ledger.merge_batch b
       SET state = 'failed', closed_at = v_now, reason = left(p_reason, 4000)
     WHERE b.id = v_b.id AND b.state = 'verifying';
    PERFORM ledger.begin_transition('requeue', 'verifier', p_v.verifier,
                jsonb_build_object('verification_id', p_v.id, 'attempt_no', v_a.attempt_no,
                                   'merge_batch', v_b.id, 'batch_size', cardinality(v_b.members),
                                   'reason', left(p_reason, 4000)));
    UPDATE ledger.campaign c SET state = 'verified' WHERE c.id = v_c.id;
    PERFORM ledger.end_transition();
    INSERT INTO ledger.side_effect (campaign_id, generation, kind, purpose, target, precondition,
                                    payload, idempotency_key, requested_by, requested_role,
                                    next_try_at, created_at, updated_at)
    SELECT v_c.id, v_c.generation, 'git.update_ref', 'promotion', v_b.ref,
           jsonb_build_object('old', v_change ->> 'old'),
           jsonb_build_object('new', v_change ->> 'new', 'candidate_ref', v_change ->> 'candidate_ref',
                              'repository', v_b.repository, 'landing', v_change -> 'landing'),
           format('promote:%s:%s:requeued', v_c.id, v_c.generation),
           p_v.verifier, 'verifier', v_now, v_now, v_now
    RETURNING id INTO v_effect;
    PERFORM ledger.append_event(v_c.id, 'side_effect.requested', p_v.verifier,
                jsonb_build_object('side_effect_id', v_effect, 'kind', 'git.update_ref',
                                   'purpose', 'promotion', 'target', v_b.ref, 'requeued', true));
    PERFORM pg_notify('ledger_outbox', v_effect::text);
    RETURN true;
END
$$;
