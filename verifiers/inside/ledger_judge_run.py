"""Ledger's pytest launcher: ``python -I ledger_judge_run.py --channel SOCKET
--checkout DIR [--pythonpath P]... -- PYTEST-ARGS...``.

Run in isolated mode (``-I``: no user site, no ``PYTHON*`` variables, neither
the current directory nor this script's on ``sys.path``), so that nothing of
the checkout can be imported before pytest and the judge are: this directory
(read-only, outside the checkout) goes first on ``sys.path``, the judge plugin
connects to the verifier, then pytest runs with the judge registered as a
plugin object -- before pytest reads its arguments, and without looking for it
among entry points. The checkout itself goes on ``sys.path`` only when the
judge's ``pytest_load_initial_conftests`` runs, after every plugin is loaded.
"""

import os
import sys


def main(argv):
    channel, checkout, pythonpath = None, None, []
    rest = list(argv)
    while rest and rest[0] != "--":
        option = rest.pop(0)
        value = rest.pop(0) if rest else None
        if value is None:
            break
        if option == "--channel":
            channel = value
        elif option == "--checkout":
            checkout = value
        elif option == "--pythonpath":
            pythonpath.append(value)
    args = rest[1:]
    if channel is None or checkout is None:
        sys.stderr.write("ledger_judge_run: --channel and --checkout are required\n")
        return 4
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import ledger_judge

    ledger_judge.connect(channel, checkout, pythonpath)
    import pytest

    code = int(pytest.main(args, plugins=[ledger_judge]))
    ledger_judge.finish(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
