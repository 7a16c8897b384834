"""The attempt protocol (``ledger.protocol``) is what an attempt command really
receives: a real worker's attempt, run in process against the test database,
records its argv, environment, standard input and campaign file, and each is
checked against the module the reference page is generated from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Actors
from ledger import protocol
from ledger.config import parse_config
from ledger.roles.attempt import MESSAGE_FILE, AttemptRun

pytestmark = [pytest.mark.anyio, pytest.mark.cells]

CLASS = "protocol"

#: Records what it was given; attempt 1 fails (exit 3), attempt 2 changes a file
#: and leaves a commit message.
SCRIPT = r'''
import json, os, sys
report, *placeholders = sys.argv[1:]
stdin = sys.stdin.read()
number = os.environ["LEDGER_ATTEMPT_NO"]
with open(os.environ["LEDGER_CAMPAIGN_FILE"]) as f:
    campaign = f.read()
with open(f"{report}-{number}.json", "w") as out:
    json.dump({"argv": placeholders, "stdin": stdin, "campaign": campaign, "cwd": os.getcwd(),
               "environment": {k: v for k, v in os.environ.items() if k.startswith("LEDGER_")}}, out)
if number == "1":
    print("first try: no idea")
    sys.exit(3)
with open("fixed.txt", "w") as f:
    f.write("fixed\n")
with open(os.environ["LEDGER_COMMIT_MESSAGE_FILE"], "w") as f:
    f.write("Fix it, the second way\n")
'''


def make_repository(root: Path) -> Path:
    repo = root / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("under repair\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    return repo


async def test_an_attempt_command_receives_exactly_the_documented_protocol(
        tmp_path: Path, actors: Actors) -> None:
    repo = make_repository(tmp_path)
    script = tmp_path / "attempt.py"
    script.write_text(SCRIPT)
    markers = tmp_path / "markers"  # the one host directory its cell may write
    markers.mkdir()
    report = markers / "seen"
    placeholders = [f"{{{name}}}" for name in protocol.PLACEHOLDERS]
    config = parse_config({"classes": {CLASS: {
        "repository": str(repo), "attempt_command": [sys.executable, str(script), str(report),
                                                     *placeholders],
        "attempt_timeout_s": 60, "lease_s": 30, "heartbeat_s": 5, "max_attempts": 3,
        "backoff": {"base_s": 0, "jitter": 0}, "cell": {"writable": [str(markers)]}}}})
    cls = config.classes[CLASS]
    await (await actors("operator")).register_class(CLASS, **cls.registration())
    cid = (await (await actors("sensor")).open_campaign(CLASS, "protocol-check", "repo#main")
           ).campaign_id
    worker = await actors("worker")
    endings = []
    for _ in range(2):
        claim = await worker.claim_campaign("worker-protocol", [CLASS])
        assert claim is not None and claim.campaign_id == cid
        endings.append(await AttemptRun(worker, claim, cls, identity="worker-protocol",
                                        data_dir=tmp_path / "data").run())
    assert endings == ["failed", "attempted"]

    first, second = (json.loads((markers / f"seen-{n}.json").read_text()) for n in (1, 2))
    for seen, number in ((first, 1), (second, 2)):
        # The same document on standard input and in the campaign file, and it is
        # exactly the model: every field present, nothing undocumented.
        assert json.loads(seen["stdin"]) == json.loads(seen["campaign"])
        document = json.loads(seen["campaign"])
        context = protocol.AttemptContext.model_validate(document)
        assert set(document) == {f.alias or name for name, f in
                                 protocol.AttemptContext.model_fields.items()}
        assert (context.campaign_id, context.attempt_no, context.class_) == (cid, number, CLASS)
        assert context.worktree == seen["cwd"] == "/cell/work" and context.base_ref == "main"
        assert context.sandboxed is True and context.network == "none"
        assert Path(context.commit_message_file).name == MESSAGE_FILE
        # Every LEDGER_ variable it got is documented, and every documented one came.
        environment = seen["environment"]
        assert set(environment) == set(protocol.ENVIRONMENT)
        assert environment["LEDGER_CAMPAIGN_FILE"].endswith("campaign.json")
        assert environment["LEDGER_OBJECTIVE"] == context.objective_key == "protocol-check"
        assert environment["LEDGER_COMMIT_MESSAGE_FILE"] == context.commit_message_file
        # Each placeholder of the argv was filled in.
        assert seen["argv"] == [environment["LEDGER_CAMPAIGN_FILE"], context.worktree, str(cid),
                                str(number)]
    told = protocol.AttemptContext.model_validate_json(second["campaign"])
    [before] = told.previous_attempts
    assert (before.attempt_no, before.outcome) == (1, "failed")
    assert before.failure_reason and "exited with 3" in before.failure_reason
    assert "first try: no idea" in before.failure_reason
