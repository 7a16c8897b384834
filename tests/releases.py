"""The earlier releases the upgrade tests run (ledger.ops.releases builds them)."""

from ledger.ops.releases import (
                                 current_ledger,
                                 have_history,
                                 installed,
                                 ledger_command,
                                 python,
                                 release,
)

__all__ = ["current_ledger", "have_history", "installed", "ledger_command", "python", "release"]
