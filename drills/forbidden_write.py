"""forbidden-write: a worker asks to move a protected ref -> refused and
recorded in security_event; the ref is unchanged."""

from __future__ import annotations

import subprocess

from ledger.errors import Forbidden
from ledger.ops.drill import Drill, DrillContext

from .workshop import CLASS, open_campaigns, setup


class ForbiddenWrite(Drill):
    name = "forbidden-write"
    summary = "a worker asks to move refs/heads/main -> Forbidden, recorded, ref unchanged"

    async def run(self, ctx: DrillContext) -> None:
        _, repo = await setup(ctx, {})
        [cid] = await open_campaigns(ctx)
        worker = await ctx.kernel("worker")
        claim = await worker.claim_campaign("drill-worker", [CLASS])
        assert claim is not None
        main = subprocess.run(["git", "-C", str(repo), "rev-parse", "main"], capture_output=True,
                              text=True, check=True).stdout.strip()
        ctx.step(f"the worker holds generation {claim.generation}; main is at {main[:12]}")
        try:
            await worker.request_side_effect(cid, claim.generation, kind="git.update_ref",
                                             target="refs/heads/main", precondition={"old": main},
                                             payload={"repository": str(repo), "new": "f" * 40},
                                             idempotency_key="drill-forbidden")
            refused = False
        except Forbidden:
            refused = True
        ctx.expect(refused, "the request is refused with Forbidden")
        rows = ctx.sql("SELECT actor_role, actor, action, target FROM ledger.security_event WHERE campaign_id = %s", cid)
        ctx.expect(rows == [{"actor_role": "worker", "actor": "drill-worker", "action": "git.update_ref",
                             "target": "refs/heads/main"}],
                   "the refusal is recorded in security_event (and survived it)", str(rows))
        ctx.expect(ctx.sql("SELECT count(*) AS n FROM ledger.side_effect")[0]["n"] == 0, "no intent was recorded")
        after = subprocess.run(["git", "-C", str(repo), "rev-parse", "main"], capture_output=True,
                               text=True, check=True).stdout.strip()
        ctx.expect(after == main, "refs/heads/main is unchanged")
        allowed = await worker.request_side_effect(
            cid, claim.generation, kind="git.update_ref", target=f"refs/heads/ledger/{cid}/x",
            precondition={"old": None}, payload={"repository": str(repo), "new": main},
            idempotency_key="drill-allowed")
        ctx.expect(allowed.status == "requested", "control: a ref inside the profile is accepted as an intent")
