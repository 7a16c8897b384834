"""Alembic environment: one session holding the advisory lock, each revision
in a transaction of its own, then the privilege self-check
(ledger.db.migrations says why)."""

from typing import Any

from alembic import context

from ledger.db import migrations

config = context.config
run = config.attributes.get("ledger_run")
if run is None:
    # Plain `alembic upgrade head` from the repository: use Ledger's settings.
    from ledger.db.database import Database
    from ledger.settings import get_settings

    settings = get_settings()
    run = migrations.Run(Database.from_settings(settings).url, settings.role_prefix)

if context.is_offline_mode():
    raise SystemExit("Ledger migrations run SQL files against a live database; offline mode is not supported "
                     "(`ledger migrate --dry-run` lists the SQL a migration would run)")


def applied(*, step: Any, **_: Any) -> None:
    migrations.step_done(step.up_revision_id)  # applied, or undone


engine = migrations.engine_for(run.url)
migrations.active = run
try:
    with engine.connect() as connection:
        migrations.prepare_session(connection, run)
        context.configure(connection=connection, transaction_per_migration=True,
                          on_version_apply=applied)
        with context.begin_transaction():
            context.run_migrations()
        migrations.finish(connection)
finally:
    migrations.active = None
    engine.dispose()
