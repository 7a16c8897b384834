"""The demo's attempt command: an "agent" that fixes calc.add.

Ledger runs it in a fresh worktree with the campaign on stdin. The first time
it makes a plausible but wrong fix; once it sees a refused earlier approach in
``previous_attempts`` it makes a different, right one. Replace it with a call
to your agent CLI (see docs/walkthrough.md).
"""

import json
import sys
from pathlib import Path

campaign = json.load(sys.stdin)
tried = [a for a in campaign["previous_attempts"] if a["outcome"] in ("attempted", "failed")]
source = Path("calc.py")
if not tried:
    print("attempt 1: the subtraction looks like a sign problem; taking the absolute value")
    source.write_text(source.read_text().replace("return a - b", "return abs(a - b)"))
else:
    print(f"attempt {campaign['attempt_no']}: an earlier approach was rejected "
          f"({tried[-1].get('failure_reason') or 'no reason'}); adding instead of subtracting")
    source.write_text(source.read_text().replace("return a - b", "return a + b"))
