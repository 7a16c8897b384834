"""``python -m ledger`` is the ``ledger`` command."""

from ledger.cli import main

main()
