"""Approving and denying from the dashboard (docs/approval.md), in a real
browser (headless Chromium against a real ``ledger serve``, as
tests/test_dashboard_browser.py): the approvals list, one page with the
conditions that asked, the candidate's diff and the verdicts with their
evidence, then the decision -- journaled as the signed-in token, the
promotion queued or the campaign sent back; a reader sees the page but no
decision. Every wait is a condition, never a sleep."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# (after the module above, which skips this one where the browser or selenium is missing)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from test_dashboard_browser import (  # noqa: F401 (fixtures)
    SENSOR_TOML,
    Server,
    browser,
    serve,
    sign_in,
    wait,
)

from conftest import Actors, Admin
from drive import Driver, record_candidate

pytestmark = pytest.mark.anyio

CLASS = "guarded"


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    yield from serve(db_url, tmp_path, SENSOR_TOML)


def repository(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository with a base commit and a candidate that changes one file."""
    repo = tmp_path / "repo"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    (repo / "app.py").write_text("def answer():\n    return 41\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "base"], check=True, env=env)
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (repo / "app.py").write_text("def answer():\n    return 42\n")
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "the fix"], check=True, env=env)
    candidate = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                               check=True).stdout.strip()
    subprocess.run(["git", "-C", str(repo), "reset", "-q", "--hard", base], check=True, env=env)
    return repo, base, candidate


async def awaiting(actors: Actors, tmp_path: Path, n: int) -> list[int]:
    op = await actors("operator")
    repo, base, candidate = repository(tmp_path)
    await op.register_class(CLASS, lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": str(repo)},
                            approval={"mode": "when", "when": [{"paths": ["*.py"]}],
                                      "timeout_s": 86400, "on_timeout": "deny"})
    d = Driver(actors, CLASS)
    ids = []
    for _ in range(n):
        cid = await d.open()
        worker = await actors("worker")
        claim = await worker.claim_campaign("agent-1", [CLASS])
        assert claim is not None
        await record_candidate(worker, claim, repo=repo, base=base, sha_=candidate, acceptance={},
                               worker="agent-1")
        verifier = await actors("verifier")
        check = await verifier.claim_verification("verifier-1")
        assert check is not None
        await verifier.accept(check.verification_id, {
            "summary": "the answer is 42 now", "change": {"files": 1, "lines": 2, "paths": ["app.py"],
                                                      "paths_truncated": False, "protected": []}})
        ids.append(cid)
    return ids


def row(admin: Admin, query: str, *params: Any) -> dict[str, Any]:
    found = admin.execute(query, params).fetchone()
    assert found is not None
    return dict(found)


async def test_an_operator_approves_and_denies_from_one_page(server: Server, browser: Any, actors: Actors,
                                                          admin: Admin, tmp_path: Path) -> None:
    d = browser
    first, second = await awaiting(actors, tmp_path, 2)
    sign_in(d, server, "operator")
    d.find_element(By.LINK_TEXT, "Approvals").click()
    wait(d, lambda d: d.execute_script("return document.body.dataset.page") == "approvals", "the approvals list")
    listed = [r.get_attribute("data-campaign") for r in d.find_elements(By.CSS_SELECTOR, "tr[data-approval]")]
    assert listed == [str(first), str(second)]
    assert "it touches app.py (*.py)" in d.find_element(By.ID, "approvals").text

    d.find_element(By.CSS_SELECTOR, f"tr[data-campaign='{first}'] a.approval-link").click()
    wait(d, lambda d: d.execute_script("return document.body.dataset.page") == "approval", "the approval page")
    # one page: why it asks, the diff, the verdicts and their evidence
    assert d.find_element(By.CSS_SELECTOR, "#reasons li[data-condition='paths']").text.endswith("(*.py)")
    diff = d.find_element(By.ID, "diff-text").text
    assert "-    return 41" in diff and "+    return 42" in diff
    verdicts = d.find_element(By.ID, "verdicts").text
    assert "the answer is 42 now" in verdicts and '"paths_truncated": false' in verdicts
    assert d.find_element(By.ID, "attempt-worker").text == "agent-1"
    d.find_element(By.CSS_SELECTOR, "#approve-form input[name='reason']").send_keys("the diff is what it says")
    d.find_element(By.ID, "approve").click()
    wait(d, lambda d: d.find_element(By.ID, "approval-head").get_attribute("data-decision") == "approved",
         "the page to show the decision")
    assert "the diff is what it says" in d.find_element(By.ID, "decision").text
    event = row(admin, "SELECT actor, actor_role, payload FROM ledger.campaign_event WHERE campaign_id = %s "
                       "AND type = 'transition' ORDER BY seq DESC LIMIT 1", first)
    assert (event["actor"], event["actor_role"], event["payload"]["transition"]) == (
        "http:operator-tok", "operator", "approve")
    intent = row(admin, "SELECT purpose, state FROM ledger.side_effect WHERE campaign_id = %s", first)
    assert intent == {"purpose": "promotion", "state": "pending"}

    d.get(f"{server.url}/ui/campaigns/{second}")
    d.find_element(By.ID, "approval-link").click()
    wait(d, lambda d: d.execute_script("return document.body.dataset.page") == "approval", "the second approval")
    d.find_element(By.CSS_SELECTOR, "#deny-form input[name='reason']").send_keys("it hard-codes the answer")
    Select(d.find_element(By.CSS_SELECTOR, "#deny-form select[name='then']")).select_by_value("ready")
    d.find_element(By.ID, "deny").click()
    wait(d, lambda d: d.find_element(By.ID, "approval-head").get_attribute("data-decision") == "denied",
         "the page to show the denial")
    campaign = row(admin, "SELECT state, last_failure_reason FROM ledger.campaign WHERE id = %s", second)
    assert campaign == {"state": "ready", "last_failure_reason": "denied: it hard-codes the answer"}
    d.find_element(By.LINK_TEXT, "Approvals").click()
    wait(d, lambda d: "Nothing waits for a person" in d.find_element(By.ID, "approvals").text,
         "an empty list")


async def test_a_reader_sees_the_approval_but_cannot_decide(server: Server, browser: Any, actors: Actors,
                                                           admin: Admin, tmp_path: Path) -> None:
    d = browser
    [cid] = await awaiting(actors, tmp_path, 1)
    sign_in(d, server, "reader")
    d.get(f"{server.url}/ui/campaigns/{cid}/approval")
    wait(d, lambda d: d.execute_script("return document.body.dataset.page") == "approval", "the approval page")
    assert d.find_elements(By.ID, "approve") == [] and d.find_elements(By.ID, "deny") == []
    assert "it touches app.py" in d.find_element(By.ID, "reasons").text
    # a forged form is refused by the database, not by the page
    # (with the sign-in's CSRF token: it is the reader's role the database refuses)
    d.execute_script(
        "var f = document.createElement('form'); f.method = 'post';"
        "f.action = '/ui/campaigns/' + arguments[0] + '/approve';"
        "var c = document.createElement('input'); c.type = 'hidden'; c.name = 'csrf';"
        "c.value = document.querySelector('input[name=csrf]').value; f.appendChild(c);"
        "document.body.appendChild(f); f.submit();", cid)
    wait(d, lambda d: d.execute_script("return document.body.dataset.page") == "error", "the refusal")
    assert "permission denied for function approve" in d.find_element(By.TAG_NAME, "main").text
    assert row(admin, "SELECT state FROM ledger.campaign WHERE id = %s", cid)["state"] == "awaiting_approval"
