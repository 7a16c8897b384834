"""The fence against every writer (issue "the fence holds"): liveness inside
the write, no NULL loophole, intents die with their generation, intake that
refuses a different request, and numbers that must be finite and bounded.

Each test here failed on the code before the fix it covers."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import Actors, Admin
from drive import Driver, fingerprint, sha
from ledger import Database, Kernel, ObjectiveConflict, StaleLease
from ledger.db.models import ProcessReport
from ledger.db.reads import Reads
from ledger.errors import InvalidInput, LedgerError
from ledger.roles.dispatcher import Dispatcher

pytestmark = pytest.mark.anyio

WRITES = ("heartbeat", "record_attempt", "fail_attempt", "append_events", "request_side_effect")


async def at(actors: Actors, actor: str, when: datetime, fn: Callable[[Kernel], Awaitable[Any]]) -> Any:
    """``fn`` in a transaction of ``actor`` with ``ledger.now()`` pinned at ``when``."""
    await actors(actor)
    async with actors.session(actor).transaction(now=when) as tx:
        return await fn(Kernel(tx))


def tables(admin: Admin) -> dict[str, list]:
    """Every row a write could touch, for before/after comparisons."""
    return {t: admin.execute(f"SELECT * FROM ledger.{t} ORDER BY 1, 2").fetchall()  # noqa: S608 (fixed names)
            for t in ("campaign", "attempt", "campaign_event", "side_effect", "security_event",
                      "verification")}


def write(name: str, cid: int | None, gen: int | None) -> Callable[[Kernel], Awaitable[Any]]:
    """One lease-holder write of ``(cid, gen)``, by name."""
    calls: dict[str, Callable[[Kernel], Awaitable[Any]]] = {
        "heartbeat": lambda k: k.heartbeat(cid, gen),  # type: ignore[arg-type]
        "record_attempt": lambda k: k.record_attempt(cid, gen, base_sha=sha(1), candidate_sha=sha(2),  # type: ignore[arg-type]
                                                     fingerprint=fingerprint(1)),
        "fail_attempt": lambda k: k.fail_attempt(cid, gen, "late"),  # type: ignore[arg-type]
        "append_events": lambda k: k.append_events(cid, gen, [{"type": "output", "payload": {"t": "x"}}]),  # type: ignore[arg-type]
        "request_side_effect": lambda k: k.request_side_effect(
            cid, gen, kind="git.update_ref", target="refs/heads/ledger/x",  # type: ignore[arg-type]
            precondition={"old": None}, idempotency_key=f"k-{name}-{cid}-{gen}"),
    }
    return calls[name]


# --- 1. an expired lease is stale at once, reaped or not --------------------------

@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize("name", WRITES)
async def test_a_write_after_expiry_is_refused_before_any_reaper_runs(actors: Actors, admin: Admin, name: str) -> None:
    op = await actors("operator")
    await op.register_class("fenced", lease_seconds=30, authority={"worker": {"refs": ["refs/heads/ledger/*"]}})
    cid, gen = await Driver(actors, "fenced").leased()
    expires = admin.execute("SELECT lease_expires_at FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()[
        "lease_expires_at"]
    before = tables(admin)
    for when in (expires, expires + timedelta(seconds=1), expires + timedelta(hours=1)):
        with pytest.raises(StaleLease, match="expired"):
            await at(actors, "worker", when, write(name, cid, gen))
    assert tables(admin) == before, "an expired holder's write changed something"
    # still leased: nobody reaped it; only the clock judged
    assert admin.execute("SELECT state FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()["state"] == "leased"
    # a moment before the expiry the same write is the holder's right
    await at(actors, "worker", expires - timedelta(milliseconds=1), write(name, cid, gen))


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_heartbeat_at_the_expiry_loses_and_one_before_renews(actors: Actors, admin: Admin, test_class: str) -> None:
    cid, gen = await Driver(actors, test_class).leased()
    expires = admin.execute("SELECT lease_expires_at FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()[
        "lease_expires_at"]
    renewed = await at(actors, "worker", expires - timedelta(microseconds=1), lambda k: k.heartbeat(cid, gen))
    assert renewed.lease_expires_at > expires and renewed.lease_remaining_s == 30
    with pytest.raises(StaleLease):
        await at(actors, "worker", renewed.lease_expires_at, lambda k: k.heartbeat(cid, gen))


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_lease_that_lapsed_while_the_server_was_down_gets_its_length_again_once(
        actors: Actors, admin: Admin, test_class: str) -> None:
    """After a restart of the database (a server incarnation not seen before:
    here, the one on record made an earlier one), the first slow path gives
    every lease in flight its whole length again from that moment, journaled;
    the holder's late heartbeat is then its right. Once per incarnation: a
    lease that lapses again is stale as ever."""
    cid, gen = await Driver(actors, test_class).leased()
    expires = admin.execute("SELECT lease_expires_at FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()[
        "lease_expires_at"]
    admin.execute("INSERT INTO ledger.meta (key, value) VALUES ('server_incarnation', 'an earlier server') "
                  "ON CONFLICT (key) DO UPDATE SET value = 'an earlier server'")
    back = expires + timedelta(seconds=10)  # the server was down past the lease
    renewed = await at(actors, "worker", back, lambda k: k.heartbeat(cid, gen))
    assert renewed.lease_remaining_s == 30
    events = admin.execute("SELECT type, payload FROM ledger.campaign_event WHERE campaign_id = %s "
                           "AND type = 'lease.renewed'", (cid,)).fetchall()
    assert len(events) == 1 and "restarted" in events[0]["payload"]["reason"]
    assert admin.execute("SELECT attempt_count, state FROM ledger.campaign WHERE id = %s", (cid,)).fetchone() == \
        {"attempt_count": 0, "state": "leased"}
    with pytest.raises(StaleLease):  # the same incarnation: no second grace
        await at(actors, "worker", renewed.lease_expires_at + timedelta(seconds=1), lambda k: k.heartbeat(cid, gen))
    reaped = await at(actors, "reaper", renewed.lease_expires_at + timedelta(seconds=1),
                      lambda k: k.expire_leases())
    assert [r.campaign_id for r in reaped] == [cid]


# --- 2. no NULL loophole, for every function that takes a generation ----------------

def _fenced_functions(admin: Admin) -> dict[str, list[tuple[str, str, bool]]]:
    """Every ledger_api function that takes a generation: its (name, type, has
    default) arguments, from the catalog -- a new one is covered automatically."""
    rows = admin.execute("""
        SELECT p.proname, a.name, a.type, a.ord > p.pronargs - p.pronargdefaults AS has_default
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          CROSS JOIN LATERAL unnest(p.proargnames, p.proargtypes::regtype[]::text[])
               WITH ORDINALITY AS a(name, type, ord)
         WHERE n.nspname = 'ledger_api' AND 'p_generation' = ANY (p.proargnames)
           AND a.ord <= p.pronargs
         ORDER BY p.proname, a.ord""").fetchall()
    functions: dict[str, list[tuple[str, str, bool]]] = {}
    for r in rows:
        functions.setdefault(r["proname"], []).append((r["name"], r["type"], r["has_default"]))
    return functions


#: A plausible value for each argument a fenced function takes (by name); a
#: new argument without an entry fails the test, so it gets one.
_ARGUMENTS: dict[str, Any] = {
    "p_base_sha": sha(1), "p_candidate_sha": sha(2), "p_fingerprint": fingerprint(1),
    "p_reason": "late", "p_events": psycopg.types.json.Jsonb([{"type": "output", "payload": {}}]),
    "p_kind": "git.update_ref", "p_target": "refs/heads/ledger/x",
    "p_precondition": psycopg.types.json.Jsonb({"old": None}), "p_idempotency_key": "k-null",
    "p_paths": ["tests/test_calc.py"], "p_action": "cell.leftover_processes",
    "p_sensor": "sensor-1", "p_status": "green", "p_started_at": datetime.now(timezone.utc),
}


async def test_every_fenced_function_refuses_null_foreign_and_stale_generations(db: Database, actors: Actors, admin: Admin) -> None:
    op = await actors("operator")
    await op.register_class("fenced", lease_seconds=30, authority={"worker": {"refs": ["refs/heads/ledger/*"]}})
    d = Driver(actors, "fenced")
    stale_cid, stale_gen = await d.leased()
    await op.abandon(stale_cid, "fence it out")  # its generation is superseded
    cid, gen = await d.leased()
    other_cid, other_gen = await d.leased()
    functions = _fenced_functions(admin)
    assert set(functions) >= set(WRITES), functions  # the catalog query finds them
    worker_role = db.role("worker")
    cases = {
        "null generation": (cid, None, "LG007"),
        "null campaign": (None, gen, "LG007"),
        "foreign generation": (cid, other_gen + 7, "LG001"),
        "stale generation": (stale_cid, stale_gen, "LG001"),
    }
    with db.connect_sync(None) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(worker_role)))
        for name, arguments in functions.items():
            for case, (campaign_id, generation, sqlstate) in cases.items():
                values: dict[str, Any] = {"p_campaign_id": campaign_id, "p_generation": generation}
                for arg, _type, has_default in arguments:
                    if arg in values:
                        continue
                    if arg not in _ARGUMENTS:
                        assert has_default, f"{name}({arg}) needs a test value in _ARGUMENTS"
                        continue
                    values[arg] = _ARGUMENTS[arg]
                statement = sql.SQL("SELECT * FROM ledger_api.{}({})").format(
                    sql.Identifier(name),
                    sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k))
                                       for k in values))
                before = tables(admin)
                with pytest.raises(psycopg.Error) as caught:
                    conn.execute(statement, values)
                assert caught.value.sqlstate == sqlstate, (name, case, caught.value)
                assert tables(admin) == before, (name, case)
    # the live lease is untouched by all of it
    assert await (await actors("worker")).heartbeat(cid, gen)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_null_ids_of_verifications_and_side_effects_are_refused(actors: Actors, admin: Admin, test_class: str) -> None:
    verifier, dispatcher = await actors("verifier"), await actors("dispatcher")
    before = tables(admin)
    for call in (lambda: verifier.heartbeat_verification(None),  # type: ignore[arg-type]
                 lambda: verifier.accept(None),  # type: ignore[arg-type]
                 lambda: verifier.reject(None, "x"),  # type: ignore[arg-type]
                 lambda: dispatcher.complete_side_effect(1, None, "done"),  # type: ignore[arg-type]
                 lambda: dispatcher.confirm_side_effect(None, 1)):  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            await call()
    assert tables(admin) == before


# --- 3. intents die with their generation --------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A bare repository: main at commit a; b and c two children of a."""
    path = tmp_path / "repo.git"
    work = tmp_path / "work"
    _git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(path))
    _git(tmp_path, "init", "--quiet", "--initial-branch=main", str(work))
    commit = ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "--allow-empty", "-m")
    _git(work, *commit, "a")
    _git(work, "branch", "a")
    for name in ("b", "c"):
        _git(work, "checkout", "--quiet", "-b", name, "a")
        _git(work, *commit, name)
    _git(work, "push", "--quiet", str(path), "a:refs/heads/main", "a", "b", "c")
    return path


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_reaped_generations_intent_is_never_carried_out(actors: Actors, admin: Admin, repo: Path) -> None:
    """g asks A->B, g is reaped, g+1 asks A->C: C lands, B is cancelled (it
    used to win the compare-and-swap and turn g+1's intent into a conflict)."""
    a, b, c = (_git(repo, "rev-parse", f"refs/heads/{n}") for n in "abc")
    op, worker = await actors("operator"), await actors("worker")
    await op.register_class("intents", lease_seconds=30, promotion={"repository": str(repo)},
                            authority={"worker": {"refs": ["refs/heads/main"]}})
    d = Driver(actors, "intents")
    cid, gen = await d.leased()

    def ask(new: str, key: str) -> Callable[[Kernel], Awaitable[Any]]:
        return lambda k: k.request_side_effect(cid, k_gen[0], kind="git.update_ref", target="refs/heads/main",
                                               precondition={"old": a}, idempotency_key=key,
                                               payload={"repository": str(repo), "new": new})
    k_gen = [gen]
    stale = await ask(b, "from-g")(worker)
    leased_at = admin.execute("SELECT leased_at FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()["leased_at"]
    later = leased_at + timedelta(minutes=5)
    reaped = await at(actors, "reaper", later, lambda k: k.expire_leases())
    assert [r.campaign_id for r in reaped] == [cid]
    claim = await at(actors, "worker", later, lambda k: k.claim_campaign("worker-2", ["intents"]))
    assert claim is not None and claim.generation == gen + 2  # reap bumped it, the claim again
    k_gen[0] = claim.generation
    current = await ask(c, "from-g2")(worker)

    dispatcher = Dispatcher(await actors("dispatcher"), poll_s=1)
    assert await dispatcher.run_once() == 1, "only the live generation's intent is claimable"
    assert _git(repo, "rev-parse", "refs/heads/main") == c
    states = {r["id"]: (r["state"], r["error"]) for r in
              admin.execute("SELECT id, state, error FROM ledger.side_effect").fetchall()}
    assert states[current.side_effect_id][0] == "done"
    assert states[stale.side_effect_id][0] == "cancelled"
    assert f"generation {gen}" in states[stale.side_effect_id][1]
    # and the cancellation is in the journal, in the reap's own event
    reap_event = admin.execute("SELECT payload FROM ledger.campaign_event WHERE campaign_id = %s AND "
                               "payload->>'transition' = 'expire_lease'", (cid,)).fetchone()["payload"]
    assert reap_event["cancelled_intents"] == [stale.side_effect_id]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_claimed_intent_whose_generation_dies_is_not_carried_out(actors: Actors, admin: Admin, repo: Path) -> None:
    """The dispatcher confirms just before acting: the worker's attempt failed
    between the claim and the action, so the intent is cancelled, not applied."""
    a, b = (_git(repo, "rev-parse", f"refs/heads/{n}") for n in "ab")
    op, worker = await actors("operator"), await actors("worker")
    await op.register_class("intents", lease_seconds=30, promotion={"repository": str(repo)},
                            authority={"worker": {"refs": ["refs/heads/main"]}})
    cid, gen = await Driver(actors, "intents").leased()
    asked = await worker.request_side_effect(cid, gen, kind="git.update_ref", target="refs/heads/main",
                                             precondition={"old": a}, idempotency_key="dies",
                                             payload={"repository": str(repo), "new": b})
    dispatcher = Dispatcher(await actors("dispatcher"), poll_s=1)
    claim = await dispatcher.kernel.claim_side_effect(dispatcher.identity)
    assert claim is not None and claim.side_effect_id == asked.side_effect_id
    await worker.fail_attempt(cid, gen, "gave up")  # the generation's attempt is over
    assert await dispatcher.dispatch(claim) is None
    assert _git(repo, "rev-parse", "refs/heads/main") == a, "the dead generation's intent moved the ref"
    row = admin.execute("SELECT state FROM ledger.side_effect WHERE id = %s", (asked.side_effect_id,)).fetchone()
    assert row["state"] == "cancelled"
    events = [r["type"] for r in admin.execute(
        "SELECT type FROM ledger.campaign_event WHERE campaign_id = %s ORDER BY seq", (cid,)).fetchall()]
    assert "side_effect.cancelled" in events


# --- 5. intake refuses a different request for an open objective ----------------------

@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_different_request_for_an_open_objective_is_refused_naming_the_fields(actors: Actors, admin: Admin, test_class: str) -> None:
    sensor = await actors("sensor")
    first = await sensor.open_campaign(test_class, "obj", "t", priority=1, labels=["b", "a"],
                                       desired_state={"tests": "pass"})
    same = await sensor.open_campaign(test_class, "obj", "t", priority=1, labels=["a", "b"],
                                      desired_state={"tests": "pass"})
    assert same.campaign_id == first.campaign_id and not same.created
    before = tables(admin)
    for change, field in ((dict(priority=5), "priority"), (dict(labels=["c"]), "labels"),
                          (dict(desired_state={"tests": "skip"}), "desired_state"),
                          (dict(seat="s1"), "seat"), (dict(acceptance={"commands": [["true"]]}), "acceptance")):
        request = dict(priority=1, labels=["a", "b"], desired_state={"tests": "pass"}) | change
        with pytest.raises(ObjectiveConflict, match=field) as caught:
            await sensor.open_campaign(test_class, "obj", "t", **request)  # type: ignore[arg-type]
        assert caught.value.sqlstate == "LG011"
        assert f'"{field}"' in (caught.value.detail or "")
    assert tables(admin) == before, "a refused request changed the open campaign"


# --- 6. every number has a finite range, enforced in SQL -----------------------------------

BAD_NUMBERS = (math.nan, math.inf, -math.inf, 1e300, -1.0)


def _numeric_parameters(admin: Admin) -> set[tuple[str, str]]:
    rows = admin.execute("""
        SELECT p.proname, a.name FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         CROSS JOIN LATERAL unnest(p.proargnames, p.proargtypes::regtype[]::text[]) AS a(name, type)
         WHERE n.nspname = 'ledger_api' AND a.type IN ('double precision', 'integer', 'bigint', 'numeric', 'real')
           AND a.name NOT IN ('p_campaign_id', 'p_generation', 'p_verification_id', 'p_side_effect_id',
                              'p_claim_token', 'p_batch_id')""").fetchall()
    return {(r["proname"], r["name"]) for r in rows}


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_every_numeric_argument_refuses_nan_infinity_and_out_of_range(actors: Actors, admin: Admin, test_class: str) -> None:
    """A table of calls, one per numeric argument of every API function; the
    catalog says which arguments exist, so a new one fails here until covered."""
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    op, worker, verifier, dispatcher, reaper, sensor = [
        await actors(a) for a in ("operator", "worker", "verifier", "dispatcher", "reaper", "sensor")]
    calls: dict[tuple[str, str], Callable[[float], Awaitable[Any]]] = {
        ("register_class", "p_lease_seconds"): lambda x: op.register_class("n", lease_seconds=x),
        ("register_class", "p_max_attempts"): lambda x: op.register_class("n", max_attempts=_int(x)),
        ("register_class", "p_backoff_base_s"): lambda x: op.register_class("n", backoff_base_s=x),
        ("register_class", "p_backoff_factor"): lambda x: op.register_class("n", backoff_factor=x),
        ("register_class", "p_backoff_cap_s"): lambda x: op.register_class("n", backoff_cap_s=x),
        ("register_class", "p_backoff_jitter"): lambda x: op.register_class("n", backoff_jitter=x),
        ("register_class", "p_weight"): lambda x: op.register_class("n", weight=_int(x)),
        ("fail_attempt", "p_retry_after_s"): lambda x: worker.fail_attempt(cid, gen, "r", retry_after_s=x),
        ("release_attempt", "p_retry_after_s"): lambda x: worker.release_attempt(cid, gen, "r", retry_after_s=x),
        ("release_verification", "p_retry_after_s"): lambda x: verifier.release_verification(
            1, "r", retry_after_s=x),
        ("complete_side_effect", "p_retry_after_s"): lambda x: dispatcher.complete_side_effect(
            1, 1, "retry", retry_after_s=x),
        ("claim_side_effect", "p_lease_s"): lambda x: dispatcher.claim_side_effect("d", lease_s=x),
        ("confirm_side_effect", "p_lease_s"): lambda x: dispatcher.confirm_side_effect(1, 1, lease_s=x),
        ("claim_verification", "p_lease_s"): lambda x: verifier.claim_verification("v", lease_s=x),
        ("heartbeat_verification", "p_lease_s"): lambda x: verifier.heartbeat_verification(1, lease_s=x),
        ("expire_leases", "p_grace_s"): lambda x: reaper.expire_leases(grace_s=x),
        ("expire_leases", "p_limit"): lambda x: reaper.expire_leases(limit=_int(x)),
        ("expire_approvals", "p_limit"): lambda x: reaper.expire_approvals(limit=_int(x)),
        ("trim_journal", "p_older_than_s"): lambda x: op.trim_journal(x),
        ("reopen", "p_extra_attempts"): lambda x: op.reopen(cid, extra_attempts=_int(x)),
        ("open_campaign", "p_priority"): lambda x: sensor.open_campaign(test_class, "prio", "t", priority=_int(x)),
        ("claim_campaigns", "p_limit"): lambda x: worker.claim_campaigns("w", limit=_int(x)),
        ("record_observation", "p_open_after"): lambda x: sensor.record_observation(
            "s", "hysteresis", "t", "red", datetime.now(timezone.utc), class_=test_class,
            open_after=_int(x)),
        ("record_observation", "p_confirm_after"): lambda x: sensor.record_observation(
            "s", "hysteresis", "t", "green", datetime.now(timezone.utc), confirm_after=_int(x)),
        ("start_web_session", "p_ttl_s"): lambda x: op.start_web_session(
            "0" * 64, "t", "reader", "0" * 64, "0" * 64, ttl_s=x),
        ("register_class", "p_heartbeat_seconds"): lambda x: op.register_class(
            "n", heartbeat_seconds=x),
        ("merge_queue_view", "p_limit"): lambda x: dispatcher.merge_queue_view(1, 1, limit=_int(x)),
        ("merge_queue_stack", "p_suspect"): lambda x: dispatcher.merge_queue_stack(
            1, 1, base_sha="a" * 40, members=[1], generations=[1], stack=["a" * 40], changes=[{}],
            suspect=_int(x), bundle={}, bundle_digest="d", diff=b"", candidate_ref="r"),
        # limits (docs/limits.md)
        ("set_limit", "p_max_leased"): lambda x: op.set_limit("repo:x", max_leased=_int(x)),
        ("set_limit", "p_max_verifying"): lambda x: op.set_limit("repo:x", max_verifying=_int(x)),
        ("set_limit", "p_max_cost_per_day"): lambda x: op.set_limit("repo:x", max_cost_per_day=x),
        ("set_limit", "p_weight"): lambda x: op.set_limit("repo:x", weight=_int(x)),
        ("set_bucket", "p_requests_per_minute"): lambda x: op.set_bucket("m", requests_per_minute=x),
        ("set_bucket", "p_tokens_per_minute"): lambda x: op.set_bucket("m", tokens_per_minute=x),
        ("set_class_limits", "p_max_cost"): lambda x: op.set_class_limits(test_class, max_cost=x),
        ("raise_budget", "p_max_cost"): lambda x: op.raise_budget(cid, x),
        ("report_usage", "p_tokens_in"): lambda x: worker.report_usage(cid, gen, tokens_in=_int(x)),
        ("report_usage", "p_tokens_out"): lambda x: worker.report_usage(cid, gen, tokens_out=_int(x)),
        ("report_usage", "p_requests"): lambda x: worker.report_usage(cid, gen, requests=_int(x)),
        ("report_usage", "p_cost"): lambda x: worker.report_usage(cid, gen, cost=x),
    }
    # The registry's report functions, one per role: the same two numbers each.
    reporters = {"sensor": sensor.report_sensor_process, "worker": worker.report_worker_process,
                 "reaper": reaper.report_reaper_process,
                 "verifier": verifier.report_verifier_process,
                 "dispatcher": dispatcher.report_dispatcher_process,
                 "operator": op.report_operator_process}
    def reporting(report: Callable[[ProcessReport], Awaitable[Any]],
                  field: str) -> Callable[[float], Awaitable[Any]]:
        return lambda x: report(_report(**{field: _int(x) if field == "pid" else x}))

    for role, report in reporters.items():
        calls[(f"report_{role}_process", "p_pid")] = reporting(report, "pid")
        calls[(f"report_{role}_process", "p_interval_s")] = reporting(report, "interval_s")
    assert set(calls) == _numeric_parameters(admin), "every numeric argument needs a row here"
    before = tables(admin)
    for (function, argument), call in calls.items():
        for bad in BAD_NUMBERS:
            if bad == -1.0 and argument == "p_priority":
                continue  # a negative priority is a priority
            with pytest.raises(InvalidInput) as caught:
                await call(bad)
            assert caught.value.sqlstate in ("LG007", "22003"), (function, argument, bad, caught.value)
    assert tables(admin) == before
    assert [c.name for c in await Reads(op.executor).classes()] == [test_class], "no class registered with a bad number"


def _report(**overrides: Any) -> ProcessReport:
    fields: dict[str, Any] = {"host": "h", "pid": 1, "started_at": datetime.now(timezone.utc),
                              "identity": "i", "service": "s", "interval_s": 1.0}
    return ProcessReport(**{**fields, **overrides})


def _int(x: float) -> int:
    """Integers have no NaN: the nearest thing is out of range (2^31 is out of an integer)."""
    if math.isnan(x) or math.isinf(x) or abs(x) > 2**40:
        return 2**40
    return int(x)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_verification_and_outbox_leases_are_judged_by_the_clock(actors: Actors, admin: Admin, test_class: str) -> None:
    """A verdict or a side effect's record after its own lease expired is refused."""
    d = Driver(actors, test_class)
    cid, vid = await d.verifying()
    expires = admin.execute("SELECT lease_expires_at FROM ledger.verification WHERE id = %s", (vid,)).fetchone()[
        "lease_expires_at"]
    before = tables(admin)
    for verdict in (lambda k: k.accept(vid), lambda k: k.reject(vid, "no"),
                    lambda k: k.heartbeat_verification(vid)):
        with pytest.raises(StaleLease):
            await at(actors, "verifier", expires, verdict)
    assert tables(admin) == before


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_retried_verdict_returns_its_first_result(actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    _, vid = await d.verifying()
    verifier = await actors("verifier")
    assert await verifier.reject(vid, "tests fail") == "ready"
    events = len(admin.execute("SELECT 1 FROM ledger.campaign_event").fetchall())
    assert await verifier.reject(vid, "tests fail") == "ready"
    assert len(admin.execute("SELECT 1 FROM ledger.campaign_event").fetchall()) == events
    with pytest.raises(LedgerError):
        await verifier.accept(vid)  # a different verdict for the same verification
