"""The operator's HTTP API (FastAPI): campaigns, live journal streams (SSE),
sensor intake, operator actions, Prometheus metrics and health probes.

Every route calls the ``Kernel`` facade as the database role its bearer token
names, so the API can never do more than that role could in SQL, and the CLI
and the API share one code path. Errors are RFC 9457 problem+json.
"""

from ledger.api.app import app_from_settings, create_app
from ledger.api.auth import Principal, TokenTable, hash_token, new_token
from ledger.api.state import ApiOptions

__all__ = ["ApiOptions", "Principal", "TokenTable", "app_from_settings", "create_app",
           "hash_token", "new_token"]
