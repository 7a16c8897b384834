"""A scripted attempt command for drills and tests: reads the campaign from stdin, then
follows the plan for its attempt number (from a JSON file next to which it
leaves markers). Steps:
  ["write", path, text]   write a file in the worktree
  ["delete", path]        delete a file in the worktree
  ["link", path, target]  make a symbolic link in the worktree
  ["message", text]       leave a commit message in $LEDGER_COMMIT_MESSAGE_FILE
  ["context", name]       save the campaign it was given as <name>-<campaign>-<attempt>.json
  ["environment", name]   save the names of its environment variables as <name>-<campaign>-<attempt>.json
  ["lines", n]            print n lines
  ["block"]               write started-<campaign>-<attempt> (its pid and PID
                          namespace inside: ledger.ops.drill.host_pid finds it) and
                          wait until release-<campaign>-<attempt> exists
  ["child"]               start a grandchild that sleeps (holding stdout open);
                          its pid and namespace in child-<c>-<a>
  ["own", dir]            write <dir>/<objective key>.txt (a change only this
                          campaign makes, named for its objective)
  ["print", text]         write text to stdout as is
  ["print-env", name]     write the value of an environment variable to stdout
  ["random", p]           write a random change; exit 0 with probability p, else 1
  ["random-own", p]       the same in a file of the campaign's own (change-<campaign>.txt),
                          so candidates of different campaigns never conflict
  ["probe-remote", url, secret]
                          try to reach the git remote itself (ls-remote, push) and to
                          read a credential file of the worker's; what happened in
                          remote-<campaign>-<attempt>.json
  ["scan", name, needles, skip]
                          look for each of ``needles`` in every byte it can see -- the
                          campaign it was given, its environment, every file and file
                          name of its cell but those under ``skip`` (and /proc, /sys,
                          /dev) -- and write what it found to <name>-<campaign>-<attempt>.json
  ["exit", code]          exit with code
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

plan_file = Path(sys.argv[1])  # in a directory the cell may write (its markers)
context = json.load(sys.stdin)
assert context == json.loads(Path(os.environ["LEDGER_CAMPAIGN_FILE"]).read_text())
assert "LEDGER_DATABASE_URL" not in os.environ, "the attempt must not see database credentials"
plan = json.loads(plan_file.read_text())
tag = f"{context['campaign_id']}-{context['attempt_no']}"
steps = plan.get(str(context["attempt_no"]), plan.get("default", [["exit", 0]]))
markers = plan_file.parent
for step in steps:
    kind = step[0]
    if kind == "write":
        Path(step[1]).parent.mkdir(parents=True, exist_ok=True)
        Path(step[1]).write_text(step[2])
    elif kind == "delete":
        Path(step[1]).unlink()
    elif kind == "link":
        Path(step[1]).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(step[2], step[1])
    elif kind == "message":
        Path(os.environ["LEDGER_COMMIT_MESSAGE_FILE"]).write_text(step[1])
    elif kind == "context":
        (markers / f"{step[1]}-{tag}.json").write_text(json.dumps(context))
    elif kind == "environment":
        (markers / f"{step[1]}-{tag}.json").write_text(json.dumps(sorted(os.environ)))
    elif kind == "lines":
        for i in range(step[1]):
            print(f"line {i} of attempt {tag}", flush=False)
        sys.stdout.flush()
    elif kind == "block":
        (markers / f"started-{tag}").write_text(f"{os.getpid()} {os.readlink('/proc/self/ns/pid')}")
        while not (markers / f"release-{tag}").exists():
            time.sleep(0.02)  # the simulated work: waiting for the test to release it
    elif kind == "child":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (markers / f"child-{tag}").write_text(f"{child.pid} {os.readlink('/proc/self/ns/pid')}")
    elif kind == "random":
        import random

        Path("random.txt").write_text(f"{random.random()}\n")
        sys.exit(0 if random.random() < step[1] else 1)
    elif kind == "random-own":
        import random

        Path(f"change-{context['campaign_id']}.txt").write_text(f"{random.random()}\n")
        sys.exit(0 if random.random() < step[1] else 1)
    elif kind == "own":
        Path(step[1]).mkdir(parents=True, exist_ok=True)
        Path(step[1], f"{context['objective_key']}.txt").write_text(context["objective_key"] + "\n")
    elif kind == "print":
        sys.stdout.write(step[1])
        sys.stdout.flush()
    elif kind == "print-env":
        sys.stdout.write(f"{step[1]}={os.environ.get(step[1], '')}\n")
        sys.stdout.flush()
    elif kind == "probe-remote":
        seen = {}
        for name, argv in (("fetch", ["git", "ls-remote", step[1]]),
                           ("push", ["git", "push", step[1], "HEAD:refs/heads/main"])):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
            seen[name] = {"exit": done.returncode, "said": done.stderr.strip()[-300:]}
        seen["credential_variables"] = sorted(k for k in os.environ if "CREDENTIAL" in k or "ASKPASS" in k
                                              or k.startswith("LEDGER_GIT") or k.startswith("SSH_"))
        try:
            Path(step[2]).read_text()
            seen["secret"] = "read"
        except OSError as exc:
            seen["secret"] = f"{type(exc).__name__}: {exc}"
        (markers / f"remote-{tag}.json").write_text(json.dumps(seen))
    elif kind == "scan":
        needles = [n.encode() for n in step[2]]
        skip = ("/proc", "/sys", "/dev", *step[3])
        found, files = [], 0
        told = json.dumps(context).encode() + b"\0".join(f"{k}={v}".encode() for k, v in os.environ.items())
        found += [f"campaign or environment: {n.decode()}" for n in needles if n in told]
        for root, dirs, names in os.walk("/"):
            dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(skip)]
            for name in names + dirs:
                path = os.path.join(root, name)
                found += [f"name {path}: {n.decode()}" for n in needles if n in path.encode()]
            for name in names:
                path = os.path.join(root, name)
                try:
                    if os.path.islink(path) or not os.path.isfile(path):
                        continue
                    with open(path, "rb") as f:
                        data = f.read(64 << 20)
                except OSError:
                    continue
                files += 1
                found += [f"{path}: {n.decode()}" for n in needles if n in data]
        (markers / f"{step[1]}-{tag}.json").write_text(json.dumps({"found": found, "files": files}))
    elif kind == "exit":
        sys.exit(step[1])
