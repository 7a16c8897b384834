-- Approval before promotion (docs/approval.md): a person looks before the change lands
--
-- A class may ask for it (campaign_class.approval): always, or when one of
-- its conditions holds for the verified candidate. The last acceptance of
-- the quorum then moves the campaign verified -> awaiting_approval
-- (request_approval, a system transition inside ledger_api.accept) instead
-- of requesting its promotion, and opens one approval row here: which
-- conditions asked, the promotion the verdicts asked for (frozen, so the
-- landed commit is the one it would have been), when it times out and what
-- the class says happens then. While it waits the campaign holds nothing:
-- no lease, no worker, no verification, no cell -- it is only these rows,
-- so it survives any restart or failover. A decision -- by the operator
-- role (approve, deny: ledger_api.approve, ledger_api.deny), never by the
-- identity that made the attempt, or by the system when the deadline passes
-- (ledger_api.expire_approvals) -- moves the campaign on: approved, its
-- promotion is requested (and enters the merge queue, waking the
-- dispatchers); denied, back to ready with the reason shown to the next
-- attempt as a rejection (its approach refused), or abandoned.
--
-- The invariants are the schema's: a campaign awaits approval iff its one
-- open approval row exists (campaign_approval below); every way out of
-- awaiting_approval records the decision on that row, once, with who made
-- it (a decided row never changes: approval_decided_once); and no promotion
-- intent exists for a generation whose approval is not approved
-- (promotion_needs_approval).

CREATE TABLE IF NOT EXISTS ledger.approval (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id     bigint NOT NULL REFERENCES ledger.campaign (id),
    generation      bigint NOT NULL,
    attempt_id      bigint NOT NULL REFERENCES ledger.attempt (id),
    -- the conditions of the class's policy that asked, each
    -- {"condition": <its key in the policy>, "detail": <what was found>}
    reasons         jsonb NOT NULL CHECK (jsonb_typeof(reasons) = 'array' AND jsonb_array_length(reasons) >= 1),
    -- the promotion intent the verdicts asked for ({target, precondition,
    -- payload, idempotency_key}); NULL: the class promotes nothing
    promotion       jsonb CHECK (jsonb_typeof(promotion) = 'object'),
    requested_at    timestamptz NOT NULL,
    -- NULL: it waits for a person however long it takes
    deadline        timestamptz,
    -- what the deadline decides (the class's approval.on_timeout, as it was
    -- when the approval was asked for)
    on_timeout      text NOT NULL DEFAULT 'deny' CHECK (on_timeout IN ('deny', 'abandon', 'approve')),
    decision        text CHECK (decision IN ('approved', 'denied', 'abandoned')),
    decided_by      text,
    decided_role    text CHECK (decided_role IN ('operator', 'system')),
    -- the transition that carried the decision out (approve, deny, abandon, *_on_timeout)
    decided_by_transition text,
    decision_reason text CHECK (length(decision_reason) <= 4000),
    decided_at      timestamptz,
    CONSTRAINT approval_decided CHECK (
        (decision IS NULL) = (decided_at IS NULL) AND (decision IS NULL) = (decided_by IS NULL)
        AND (decision IS NULL) = (decided_role IS NULL)),
    CONSTRAINT approval_one_per_generation UNIQUE (campaign_id, generation)
);
-- At most one open approval per campaign.
CREATE UNIQUE INDEX IF NOT EXISTS approval_one_open ON ledger.approval (campaign_id)
    WHERE decision IS NULL;
-- The deadlines the reaper decides (expire_approvals), soonest first.
CREATE INDEX IF NOT EXISTS approval_due ON ledger.approval (deadline)
    WHERE decision IS NULL AND deadline IS NOT NULL;

-- A decision is final, and approvals are never deleted: they are the record
-- of who let what through.
CREATE OR REPLACE FUNCTION ledger.approval_decided_once() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'approvals are kept: approval % cannot be deleted', OLD.id USING ERRCODE = 'LG009';
    END IF;
    IF OLD.decision IS NOT NULL THEN
        RAISE EXCEPTION 'approval % was decided already (% by %): a decision is final',
            OLD.id, OLD.decision, OLD.decided_by USING ERRCODE = 'LG009';
    END IF;
    IF NEW.campaign_id <> OLD.campaign_id OR NEW.generation <> OLD.generation
       OR NEW.attempt_id <> OLD.attempt_id OR NEW.reasons <> OLD.reasons
       OR NEW.promotion IS DISTINCT FROM OLD.promotion OR NEW.requested_at <> OLD.requested_at
       OR NEW.deadline IS DISTINCT FROM OLD.deadline OR NEW.on_timeout <> OLD.on_timeout THEN
        RAISE EXCEPTION 'what approval % asks for cannot change, only be decided', OLD.id
            USING ERRCODE = 'LG009';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER approval_decided_once BEFORE UPDATE OR DELETE ON ledger.approval
    FOR EACH ROW EXECUTE FUNCTION ledger.approval_decided_once();

-- A campaign enters awaiting_approval only with its open approval at its
-- generation, and whatever moves it out (a decision, a timeout, a plain
-- abandon) decides that approval: once, naming who (the transition's actor
-- and role) and why (its reason). A notice still waiting to be sent is
-- moot then and is cancelled.
CREATE OR REPLACE FUNCTION ledger.campaign_approval() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
BEGIN
    IF NEW.state = 'awaiting_approval' THEN
        IF NOT EXISTS (SELECT 1 FROM ledger.approval ap
                        WHERE ap.campaign_id = NEW.id AND ap.generation = NEW.generation
                          AND ap.decision IS NULL) THEN
            RAISE EXCEPTION 'campaign % awaits approval only with an open approval at generation %',
                NEW.id, NEW.generation USING ERRCODE = 'LG002';
        END IF;
        RETURN NULL;
    END IF;
    UPDATE ledger.approval ap
       SET decision = CASE NEW.state WHEN 'verified' THEN 'approved'
                                     WHEN 'abandoned' THEN 'abandoned' ELSE 'denied' END,
           decided_by = coalesce(nullif(current_setting('ledger.actor', true), ''), 'system'),
           decided_role = CASE WHEN current_setting('ledger.actor_role', true) = 'operator'
                               THEN 'operator' ELSE 'system' END,
           decided_by_transition = nullif(current_setting('ledger.transition', true), ''),
           decision_reason = left(v_detail ->> 'reason', 4000),
           decided_at = ledger.now()
     WHERE ap.campaign_id = NEW.id AND ap.decision IS NULL
    RETURNING ap.id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'campaign % left awaiting_approval without an open approval', NEW.id
            USING ERRCODE = 'LG002';
    END IF;
    UPDATE ledger.side_effect s
       SET state = 'cancelled', finished_at = ledger.now(), updated_at = ledger.now(),
           error = format('approval %s was decided before its notice was sent', v_id)
     WHERE s.campaign_id = NEW.id AND s.idempotency_key = format('approval:%s', v_id)
       AND s.state = 'pending';
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER campaign_approval AFTER UPDATE OF state ON ledger.campaign
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND (OLD.state = 'awaiting_approval' OR NEW.state = 'awaiting_approval'))
    EXECUTE FUNCTION ledger.campaign_approval();

-- Nothing is promoted without its approval: a promotion intent for a
-- campaign awaiting one, or for a generation whose approval was not given,
-- is refused, whoever writes it.
CREATE OR REPLACE FUNCTION ledger.promotion_needs_approval() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ap ledger.approval;
BEGIN
    SELECT * INTO v_ap FROM ledger.approval ap
     WHERE ap.campaign_id = NEW.campaign_id AND ap.generation = NEW.generation;
    IF FOUND AND v_ap.decision IS DISTINCT FROM 'approved' THEN
        RAISE EXCEPTION 'campaign % has no approval to promote generation % (approval % is %)',
            NEW.campaign_id, NEW.generation, v_ap.id, coalesce(v_ap.decision, 'waiting')
            USING ERRCODE = 'LG002';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER side_effect_promotion_approved BEFORE INSERT ON ledger.side_effect
    FOR EACH ROW
    WHEN (NEW.purpose = 'promotion')
    EXECUTE FUNCTION ledger.promotion_needs_approval();

-- A glob as the policies write them: '*' is any run of characters, '/'
-- included; everything else is itself.
CREATE OR REPLACE FUNCTION ledger.glob_matches(p_pattern text, p_value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_value LIKE replace(replace(replace(replace(p_pattern, '\', '\\'), '%', '\%'), '_', '\_'),
                                '*', '%')
$$;

-- A class's approval policy, checked and returned as stored (register_class):
--   {"mode": "never"} (or {}), {"mode": "always"}, or {"mode": "when", "when":
--   [condition, ...]}, each condition an object of one key:
--     {"protected_paths": true}      the candidate changes protected paths
--                                    (a class that allows it)
--     {"diff_lines_over": N}         its diff adds and removes more than N lines
--     {"paths": [glob, ...]}         it touches one of these paths
--     {"quorum_split": true}         a verifier of the quorum accepted but
--                                    asks for a person (a review's needs_human)
--     {"attempts_over": N}           the campaign spent more than N attempts
--                                    of its budget
--     {"first_promotions": N}        fewer than N campaigns of the class were
--                                    promoted before
--     {"targets": [glob, ...]}       it promotes onto one of these refs
--   and optionally "timeout_s" (1 s to a year: no decision by then decides
--   "on_timeout": deny, abandon or approve; default deny) and "notify"
--   ({"url": http(s) URL}: a notice is POSTed there for each approval asked).
CREATE OR REPLACE FUNCTION ledger.check_approval_policy(p_policy jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_mode text;
    v_cond jsonb;
    v_key text;
BEGIN
    IF p_policy IS NULL OR p_policy = '{}'::jsonb THEN
        RETURN '{}'::jsonb;
    END IF;
    IF jsonb_typeof(p_policy) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(p_policy) k
                   WHERE k NOT IN ('mode', 'when', 'timeout_s', 'on_timeout', 'notify')) THEN
        RAISE EXCEPTION 'approval must be an object of mode, when, timeout_s, on_timeout and notify'
            USING ERRCODE = 'LG007';
    END IF;
    v_mode := coalesce(p_policy ->> 'mode', 'never');
    IF v_mode NOT IN ('never', 'always', 'when') THEN
        RAISE EXCEPTION 'approval.mode must be never, always or when, not %', v_mode USING ERRCODE = 'LG007';
    END IF;
    IF (v_mode = 'when') <> (p_policy ? 'when') OR (p_policy ? 'when' AND (
           jsonb_typeof(p_policy -> 'when') <> 'array' OR jsonb_array_length(p_policy -> 'when') NOT BETWEEN 1 AND 32)) THEN
        RAISE EXCEPTION 'approval.when (1 to 32 conditions) goes with mode when, and only with it'
            USING ERRCODE = 'LG007';
    END IF;
    FOR v_cond IN SELECT c FROM jsonb_array_elements(coalesce(p_policy -> 'when', '[]')) c LOOP
        IF jsonb_typeof(v_cond) <> 'object' OR (SELECT count(*) FROM jsonb_object_keys(v_cond)) <> 1 THEN
            RAISE EXCEPTION 'each approval condition is an object of one key, not %', v_cond
                USING ERRCODE = 'LG007';
        END IF;
        v_key := (SELECT k FROM jsonb_object_keys(v_cond) k);
        CASE v_key
            WHEN 'protected_paths', 'quorum_split' THEN
                IF v_cond -> v_key <> 'true'::jsonb THEN
                    RAISE EXCEPTION 'approval condition % takes true', v_key USING ERRCODE = 'LG007';
                END IF;
            WHEN 'diff_lines_over', 'attempts_over', 'first_promotions' THEN
                IF jsonb_typeof(v_cond -> v_key) <> 'number' THEN
                    RAISE EXCEPTION 'approval condition % takes a number', v_key USING ERRCODE = 'LG007';
                END IF;
                PERFORM ledger.check_range('approval.' || v_key, (v_cond ->> v_key)::numeric,
                                           CASE v_key WHEN 'first_promotions' THEN 1 ELSE 0 END,
                                           CASE v_key WHEN 'attempts_over' THEN 1000 ELSE 1e9 END);
            WHEN 'paths', 'targets' THEN
                IF jsonb_typeof(v_cond -> v_key) <> 'array' OR jsonb_array_length(v_cond -> v_key) NOT BETWEEN 1 AND 100
                   OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_cond -> v_key) g
                               WHERE jsonb_typeof(g) <> 'string' OR length(g #>> '{}') NOT BETWEEN 1 AND 500) THEN
                    RAISE EXCEPTION 'approval condition % takes 1 to 100 globs (strings of 1 to 500 characters)',
                        v_key USING ERRCODE = 'LG007';
                END IF;
            ELSE
                RAISE EXCEPTION 'unknown approval condition % (known: protected_paths, diff_lines_over, paths, quorum_split, attempts_over, first_promotions, targets)',
                    v_key USING ERRCODE = 'LG007';
        END CASE;
    END LOOP;
    IF p_policy ? 'timeout_s' THEN
        IF jsonb_typeof(p_policy -> 'timeout_s') <> 'number' THEN
            RAISE EXCEPTION 'approval.timeout_s must be a number of seconds' USING ERRCODE = 'LG007';
        END IF;
        PERFORM ledger.check_range('approval.timeout_s', (p_policy ->> 'timeout_s')::numeric, 1, 31536000);
    END IF;
    IF coalesce(p_policy ->> 'on_timeout', 'deny') NOT IN ('deny', 'abandon', 'approve')
       OR (p_policy ? 'on_timeout' AND jsonb_typeof(p_policy -> 'on_timeout') <> 'string') THEN
        RAISE EXCEPTION 'approval.on_timeout must be deny, abandon or approve' USING ERRCODE = 'LG007';
    END IF;
    IF p_policy ? 'notify' AND (jsonb_typeof(p_policy -> 'notify') <> 'object'
                                OR (SELECT array_agg(k) FROM jsonb_object_keys(p_policy -> 'notify') k) <> ARRAY['url']
                                OR jsonb_typeof(p_policy -> 'notify' -> 'url') <> 'string'
                                OR NOT (p_policy -> 'notify' ->> 'url') ~ '^https?://[^/?#[:space:]]+([/?#][^[:space:]]*)?$'
                                OR length(p_policy -> 'notify' ->> 'url') > 2000) THEN
        RAISE EXCEPTION 'approval.notify must be {"url": an http or https URL of at most 2000 characters}'
            USING ERRCODE = 'LG007';
    END IF;
    RETURN p_policy;
END
$$;

-- Which conditions of its class's policy ask a person to approve campaign
-- p_c's candidate (attempt p_a, its quorum's verdicts all in): an array of
-- {condition, detail}, or NULL when none does. A condition about the
-- change that no verdict measured (a verifier of an older release) asks:
-- what cannot be told is shown to a person. A candidate whose change (its
-- fingerprint) a person approved already on this campaign -- rebased onto a
-- moved target since -- asks nothing again.
CREATE OR REPLACE FUNCTION ledger.approval_reasons(p_c ledger.campaign, p_a ledger.attempt)
    RETURNS jsonb
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_policy jsonb;
    v_ref text;
    v_mode text;
    v_change jsonb;
    v_cond jsonb;
    v_key text;
    v_reasons jsonb := '[]';
    v_found text;
    v_n bigint;
    v_unmeasured constant text := 'no verdict measured the change (a verifier of an older release?): a person looks';
BEGIN
    SELECT cc.approval, cc.promotion ->> 'ref' INTO v_policy, v_ref
      FROM ledger.campaign_class cc WHERE cc.name = p_c.class;
    v_mode := coalesce(v_policy ->> 'mode', 'never');
    IF v_mode = 'never' THEN
        RETURN NULL;
    END IF;
    IF p_a.fingerprint IS NOT NULL AND EXISTS (
           SELECT 1 FROM ledger.approval ap JOIN ledger.attempt a ON a.id = ap.attempt_id
            WHERE ap.campaign_id = p_c.id AND ap.decision = 'approved' AND a.fingerprint = p_a.fingerprint) THEN
        RETURN NULL;
    END IF;
    IF v_mode = 'always' THEN
        RETURN jsonb_build_array(jsonb_build_object(
            'condition', 'always', 'detail', 'the class asks a person before every promotion'));
    END IF;
    -- the change as a verifier measured it from the repository (evidence.change)
    SELECT v.evidence -> 'change' INTO v_change
      FROM ledger.verification v
     WHERE v.campaign_id = p_c.id AND v.generation = p_c.generation AND v.status = 'accepted'
       AND jsonb_typeof(v.evidence -> 'change') = 'object'
     ORDER BY v.id LIMIT 1;
    FOR v_cond IN SELECT c FROM jsonb_array_elements(v_policy -> 'when') c LOOP
        v_key := (SELECT k FROM jsonb_object_keys(v_cond) k LIMIT 1);
        v_found := NULL;
        CASE v_key
            WHEN 'protected_paths' THEN
                IF v_change IS NULL OR NOT v_change ? 'protected' THEN
                    v_found := v_unmeasured;
                ELSIF jsonb_array_length(v_change -> 'protected') > 0 THEN
                    SELECT 'it changes protected paths: ' || string_agg(p, ', ')
                      INTO v_found
                      FROM (SELECT p FROM jsonb_array_elements_text(v_change -> 'protected') p LIMIT 10) x;
                END IF;
            WHEN 'diff_lines_over' THEN
                IF v_change IS NULL OR jsonb_typeof(v_change -> 'lines') <> 'number' THEN
                    v_found := v_unmeasured;
                ELSIF (v_change ->> 'lines')::numeric > (v_cond ->> v_key)::numeric THEN
                    v_found := format('its diff changes %s lines (more than %s)', v_change ->> 'lines',
                                      v_cond ->> v_key);
                END IF;
            WHEN 'paths' THEN
                IF v_change IS NULL OR jsonb_typeof(v_change -> 'paths') <> 'array' THEN
                    v_found := v_unmeasured;
                ELSE
                    SELECT format('it touches %s (%s)', p, g) INTO v_found
                      FROM jsonb_array_elements_text(v_change -> 'paths') p,
                           jsonb_array_elements_text(v_cond -> v_key) g
                     WHERE ledger.glob_matches(g, p)
                     LIMIT 1;
                    IF v_found IS NULL AND (v_change ->> 'paths_truncated')::boolean THEN
                        v_found := 'it changes more paths than were listed: a person looks';
                    END IF;
                END IF;
            WHEN 'quorum_split' THEN
                SELECT format('%s verdict by %s asks for a person: %s', v.kind, v.verifier,
                              left(coalesce(v.evidence ->> 'needs_human', ''), 500))
                  INTO v_found
                  FROM ledger.verification v
                 WHERE v.campaign_id = p_c.id AND v.generation = p_c.generation AND v.status = 'accepted'
                   AND v.evidence ? 'needs_human'
                   AND v.evidence -> 'needs_human' NOT IN ('false'::jsonb, 'null'::jsonb, '""'::jsonb)
                 ORDER BY v.id LIMIT 1;
            WHEN 'attempts_over' THEN
                IF p_c.attempt_count > (v_cond ->> v_key)::numeric THEN
                    v_found := format('it spent %s attempts of its budget (more than %s)',
                                      p_c.attempt_count, v_cond ->> v_key);
                END IF;
            WHEN 'first_promotions' THEN
                SELECT count(*) INTO v_n FROM ledger.campaign c
                 WHERE c.class = p_c.class AND c.promoted_at IS NOT NULL AND c.id <> p_c.id;
                IF v_n < (v_cond ->> v_key)::numeric THEN
                    v_found := format('promotion %s of the class''s first %s', v_n + 1, v_cond ->> v_key);
                END IF;
            WHEN 'targets' THEN
                SELECT format('it promotes onto %s (%s)', v_ref, g) INTO v_found
                  FROM jsonb_array_elements_text(v_cond -> v_key) g
                 WHERE v_ref IS NOT NULL AND ledger.glob_matches(g, v_ref)
                 LIMIT 1;
            ELSE
                v_found := format('unknown condition %s: a person looks', v_key);
        END CASE;
        IF v_found IS NOT NULL THEN
            v_reasons := v_reasons || jsonb_build_array(jsonb_build_object('condition', v_key, 'detail', v_found));
        END IF;
    END LOOP;
    RETURN CASE WHEN jsonb_array_length(v_reasons) > 0 THEN v_reasons END;
END
$$;

-- Request campaign p_campaign_id's promotion at generation p_generation
-- (intent before action): the intent p_promotion describes ({target,
-- precondition, payload, idempotency_key}), journaled; the dispatchers are
-- woken (a hint: they also poll). Returns the intent's id.
CREATE OR REPLACE FUNCTION ledger.request_promotion(p_campaign_id bigint, p_generation bigint,
                                                    p_promotion jsonb, p_by text, p_role text)
    RETURNS bigint
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_effect bigint;
BEGIN
    INSERT INTO ledger.side_effect (campaign_id, generation, kind, purpose, target, precondition,
                                    payload, idempotency_key, requested_by, requested_role,
                                    next_try_at, created_at, updated_at)
    VALUES (p_campaign_id, p_generation, 'git.update_ref', 'promotion', p_promotion ->> 'target',
            p_promotion -> 'precondition', p_promotion -> 'payload', p_promotion ->> 'idempotency_key',
            p_by, p_role, v_now, v_now, v_now)
    RETURNING id INTO v_effect;
    PERFORM ledger.append_event(p_campaign_id, 'side_effect.requested', p_by,
                jsonb_build_object('side_effect_id', v_effect, 'kind', 'git.update_ref',
                                   'purpose', 'promotion', 'target', p_promotion ->> 'target'));
    PERFORM pg_notify('ledger_outbox', v_effect::text);
    RETURN v_effect;
END
$$;

-- The last acceptance found that a person must look first (inside accept):
-- open the approval, move the campaign verified -> awaiting_approval, and
-- request the notice of the class's hook (an http.request intent, sent with
-- its own Idempotency-Key). Returns the approval's id.
CREATE OR REPLACE FUNCTION ledger.request_approval(p_campaign_id bigint, p_attempt_id bigint,
                                                   p_reasons jsonb, p_promotion jsonb)
    RETURNS bigint
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_a ledger.attempt;
    v_policy jsonb;
    v_deadline timestamptz;
    v_on_timeout text;
    v_id bigint;
    v_url text;
    v_effect bigint;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id;
    SELECT * INTO v_a FROM ledger.attempt a WHERE a.id = p_attempt_id;
    SELECT cc.approval INTO v_policy FROM ledger.campaign_class cc WHERE cc.name = v_c.class;
    v_deadline := v_now + make_interval(secs => (v_policy ->> 'timeout_s')::double precision);
    v_on_timeout := coalesce(v_policy ->> 'on_timeout', 'deny');
    INSERT INTO ledger.approval (campaign_id, generation, attempt_id, reasons, promotion, requested_at,
                                 deadline, on_timeout)
    VALUES (v_c.id, v_c.generation, v_a.id, p_reasons, p_promotion, v_now, v_deadline, v_on_timeout)
    RETURNING id INTO v_id;
    PERFORM ledger.begin_transition('request_approval', 'system', 'system',
                jsonb_build_object('approval_id', v_id, 'attempt_no', v_a.attempt_no,
                                   'reasons', p_reasons, 'deadline', v_deadline,
                                   'on_timeout', v_on_timeout));
    UPDATE ledger.campaign c SET state = 'awaiting_approval' WHERE c.id = v_c.id;
    PERFORM ledger.end_transition();
    v_url := v_policy -> 'notify' ->> 'url';
    IF v_url IS NOT NULL THEN
        INSERT INTO ledger.side_effect (campaign_id, generation, kind, purpose, target, precondition,
                                        payload, idempotency_key, requested_by, requested_role,
                                        next_try_at, created_at, updated_at)
        VALUES (v_c.id, v_c.generation, 'http.request', 'other', v_url, '{}',
                jsonb_build_object('method', 'POST', 'url', v_url, 'body', jsonb_build_object(
                    'text', format('Ledger: campaign %s (%s: %s) awaits approval: %s', v_c.id, v_c.class,
                                   v_c.objective_key,
                                   (SELECT string_agg(r ->> 'detail', '; ') FROM jsonb_array_elements(p_reasons) r)),
                    'event', 'approval.requested', 'approval_id', v_id, 'campaign_id', v_c.id,
                    'class', v_c.class, 'objective_key', v_c.objective_key, 'target', v_c.target,
                    'attempt_no', v_a.attempt_no, 'candidate_sha', v_a.candidate_sha,
                    'reasons', p_reasons, 'requested_at', v_now, 'deadline', v_deadline,
                    'on_timeout', v_on_timeout)),
                format('approval:%s', v_id), 'system', 'system', v_now, v_now, v_now)
        RETURNING id INTO v_effect;
        PERFORM ledger.append_event(v_c.id, 'side_effect.requested', 'system',
                    jsonb_build_object('side_effect_id', v_effect, 'kind', 'http.request',
                                       'purpose', 'approval_notice', 'target', v_url));
        PERFORM pg_notify('ledger_outbox', v_effect::text);
    END IF;
    RETURN v_id;
END
$$;

-- Carry out a decision on campaign p_c's open approval p_ap (locked by the
-- caller): p_decision approve (verified: its promotion requested, or, for a
-- class that promotes nothing, promoted there and then), deny (ready after
-- the class's backoff -- or exhausted if its attempts are spent -- the
-- attempt's verdict rejected with the reason, its approach refused) or
-- abandon (abandoned, generation bumped), as transition p_transition of
-- p_role's p_actor. The approval row itself is decided by the campaign's
-- trigger (campaign_approval). Returns the state the campaign is left in.
CREATE OR REPLACE FUNCTION ledger.decide_approval(p_c ledger.campaign, p_ap ledger.approval,
                                                  p_decision text, p_transition text, p_role text,
                                                  p_actor text, p_reason text)
    RETURNS text
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_a ledger.attempt;
    v_detail jsonb;
BEGIN
    SELECT * INTO v_a FROM ledger.attempt a WHERE a.id = p_ap.attempt_id;
    v_detail := jsonb_build_object('approval_id', p_ap.id, 'attempt_no', v_a.attempt_no,
                                   'reason', left(p_reason, 4000), 'reasons', p_ap.reasons);
    IF p_decision = 'approve' THEN
        UPDATE ledger.attempt a SET verdict = 'accepted' WHERE a.id = v_a.id AND a.verdict IS NULL;
        PERFORM ledger.begin_transition(p_transition, p_role, p_actor, v_detail);
        UPDATE ledger.campaign c
           SET state = 'verified',
               promoted_at = CASE WHEN p_ap.promotion IS NULL THEN v_now END,
               promoted_sha = CASE WHEN p_ap.promotion IS NULL THEN v_a.candidate_sha END
         WHERE c.id = p_c.id;
        PERFORM ledger.end_transition();
        IF p_ap.promotion IS NOT NULL THEN
            PERFORM ledger.request_promotion(p_c.id, p_c.generation, p_ap.promotion, p_actor, p_role);
        END IF;
        RETURN 'verified';
    END IF;
    UPDATE ledger.attempt a
       SET verdict = 'rejected',
           failure_reason = left(format('denied by %s: %s', p_actor, p_reason), 4000)
     WHERE a.id = v_a.id AND a.verdict IS NULL;
    IF p_decision = 'abandon' THEN
        PERFORM ledger.begin_transition(p_transition, p_role, p_actor, v_detail || '{"denied": true}');
        UPDATE ledger.campaign c SET state = 'abandoned', generation = c.generation + 1
         WHERE c.id = p_c.id;
        PERFORM ledger.end_transition();
        RETURN 'abandoned';
    END IF;
    PERFORM ledger.begin_transition(p_transition, p_role, p_actor, v_detail);
    UPDATE ledger.campaign c
       SET state = 'ready', next_attempt_at = v_now + ledger.backoff(c.class, c.attempt_count),
           last_failure_reason = left('denied: ' || p_reason, 4000)
     WHERE c.id = p_c.id;
    PERFORM ledger.end_transition();
    IF ledger.exhaust_if_spent(p_c.id) THEN
        RETURN 'exhausted';
    END IF;
    RETURN 'ready';
END
$$;

-- An operator's decision on campaign p_campaign_id's open approval
-- (ledger_api.approve and ledger_api.deny): the campaign and its approval
-- locked, the decider's identity checked (given, and not the identity that
-- made the attempt), the decision carried out. Retried after it committed
-- (its reply lost), the same decision by the same operator returns what it
-- did; any other decision on a decided approval is refused.
CREATE OR REPLACE FUNCTION ledger.operator_decision(p_campaign_id bigint, p_operator text,
                                                    p_decision text, p_reason text)
    RETURNS TABLE (approval_id bigint, decision text, state text, generation bigint,
                   side_effect_id bigint)
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_c ledger.campaign;
    v_ap ledger.approval;
    v_worker text;
    v_state text;
    v_word text := CASE p_decision WHEN 'approve' THEN 'approved' WHEN 'abandon' THEN 'abandoned'
                                   ELSE 'denied' END;
BEGIN
    IF p_campaign_id IS NULL THEN
        RAISE EXCEPTION 'a campaign id is required' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_length('operator', p_operator, 1, 200);
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    SELECT * INTO v_ap FROM ledger.approval ap
     WHERE ap.campaign_id = p_campaign_id ORDER BY ap.id DESC LIMIT 1 FOR UPDATE;
    IF v_c.state <> 'awaiting_approval' THEN
        IF v_ap.decision = v_word AND v_ap.decided_by = p_operator AND v_ap.decided_role = 'operator'
           AND (p_decision = 'approve' OR v_ap.decision_reason IS NOT DISTINCT FROM left(p_reason, 4000)) THEN
            -- this very decision, retried: it is in
            RETURN QUERY SELECT v_ap.id, v_ap.decision, v_c.state, v_c.generation,
                (SELECT s.id FROM ledger.side_effect s
                  WHERE s.campaign_id = v_c.id AND s.generation = v_ap.generation
                    AND s.purpose = 'promotion' ORDER BY s.id LIMIT 1);
            RETURN;
        END IF;
        RAISE EXCEPTION 'campaign % is not awaiting approval (it is %)', p_campaign_id,
            v_c.state || coalesce(format('; approval %s was %s by %s', v_ap.id, v_ap.decision, v_ap.decided_by), '')
            USING ERRCODE = 'LG002';
    END IF;
    SELECT a.worker INTO v_worker FROM ledger.attempt a WHERE a.id = v_ap.attempt_id;
    IF v_worker = p_operator THEN
        RAISE EXCEPTION 'an approval must come from another identity than the one that made the attempt (%)',
            v_worker USING ERRCODE = 'LG008';
    END IF;
    v_state := ledger.decide_approval(v_c, v_ap, p_decision,
                                      CASE p_decision WHEN 'approve' THEN 'approve'
                                                      WHEN 'abandon' THEN 'abandon' ELSE 'deny' END,
                                      'operator', p_operator, p_reason);
    RETURN QUERY SELECT v_ap.id, v_word, v_state,
        (SELECT c.generation FROM ledger.campaign c WHERE c.id = v_c.id),
        (SELECT s.id FROM ledger.side_effect s
          WHERE s.campaign_id = v_c.id AND s.generation = v_ap.generation
            AND s.purpose = 'promotion' ORDER BY s.id LIMIT 1);
END
$$;
