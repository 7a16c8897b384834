"""The OpenAPI document is the contract: query parameters it does not list are
refused (422 problem) instead of silently ignored, so a misspelt filter
(``?stat=ready``) never lists everything, and a bulk action never widens."""

from __future__ import annotations

from fastapi import FastAPI, Request

from ledger.errors import InvalidInput


def _query_names(app: FastAPI) -> dict[tuple[str, str], frozenset[str]]:
    names: dict[tuple[str, str], frozenset[str]] = {}
    for path, operations in app.openapi().get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict):
                continue
            names[(path, method.upper())] = frozenset(
                p["name"] for p in operation.get("parameters", []) if p.get("in") == "query")
    return names


async def refuse_unknown_query(request: Request) -> None:
    """App-wide dependency: 422 if the query has a parameter the route does not declare."""
    if not request.query_params:
        return
    api = request.app.state.ledger
    if api.query_names is None:
        api.query_names = _query_names(request.app)
    route = request.scope.get("route")
    allowed = api.query_names.get((getattr(route, "path_format", ""), request.method),
                                  frozenset())
    unknown = sorted(set(request.query_params.keys()) - allowed)
    if unknown:
        raise InvalidInput(f"unknown query parameter(s): {', '.join(unknown)}"
                           + (f"; this route takes {', '.join(sorted(allowed))}" if allowed
                              else "; this route takes none"))
