"""Alembic environment: one transaction, one advisory lock, every revision, then
the privilege self-check."""

from alembic import context

from ledger.db.migrations import engine_for, finish, prepare

config = context.config
url = config.attributes.get("ledger_url")
role_prefix = config.attributes.get("ledger_role_prefix")
if url is None:
    # Plain `alembic upgrade head` from the repository: use Ledger's settings.
    from ledger.db.database import Database
    from ledger.settings import get_settings

    settings = get_settings()
    url = Database.from_settings(settings).url
    role_prefix = settings.role_prefix

if context.is_offline_mode():
    raise SystemExit("Ledger migrations run SQL files against a live database; offline mode is not supported")

engine = engine_for(url)
with engine.connect() as connection:
    with connection.begin():
        prepare(connection, role_prefix)
        context.configure(connection=connection, transaction_per_migration=False)
        context.run_migrations()
        finish(connection)
engine.dispose()
