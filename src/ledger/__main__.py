"""``python -m ledger`` is the ``ledger`` command."""

from .cli import main

main()
