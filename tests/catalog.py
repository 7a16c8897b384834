"""A full, comparable listing of Ledger's objects in one database, read from
the catalogs: what two databases must agree on to be the same schema.

Used by tests/test_schema.py and tests/test_upgrade.py to compare a database
built by the migrations with one built from src/ledger/db/sql directly, and
with one of an earlier release upgraded. Role names appear as they are (the
databases use the same prefix), so grants compare exactly. A column's
position is left out: a revision adds a column at the end of its table,
where the schema file may list it among its neighbours.
"""

from __future__ import annotations

import psycopg

SCHEMAS = "('ledger', 'ledger_api')"

QUERIES: dict[str, str] = {
    "schema": f"""
        SELECT format('%s owner=%s acl=%s comment=%s', n.nspname, pg_get_userbyid(n.nspowner),
                      n.nspacl, obj_description(n.oid, 'pg_namespace'))
          FROM pg_namespace n WHERE n.nspname IN {SCHEMAS}""",
    "function": f"""
        SELECT format(E'%s.%s(%s) owner=%s acl=%s config=%s comment=%s\\n%s',
                      n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
                      pg_get_userbyid(p.proowner), p.proacl, p.proconfig,
                      obj_description(p.oid, 'pg_proc'), pg_get_functiondef(p.oid))
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname IN {SCHEMAS}""",
    "relation": f"""
        SELECT format('%s.%s kind=%s owner=%s acl=%s', n.nspname, c.relname, c.relkind,
                      pg_get_userbyid(c.relowner), c.relacl)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname IN {SCHEMAS}""",
    "column": f"""
        SELECT format('%s.%s %s %s%s%s default=%s', n.nspname, c.relname, a.attname,
                      format_type(a.atttypid, a.atttypmod),
                      CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                      CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END,
                      pg_get_expr(d.adbin, d.adrelid))
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname IN {SCHEMAS} AND c.relkind IN ('r', 'v')
           AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraint": f"""
        SELECT format('%s.%s %s', c.relname, co.conname, pg_get_constraintdef(co.oid))
          FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace
          JOIN pg_class c ON c.oid = co.conrelid
         WHERE n.nspname IN {SCHEMAS} AND co.contype <> 'n'  -- PG 18 lists NOT NULL here""",
    "index": f"""
        SELECT indexdef FROM pg_indexes WHERE schemaname IN {SCHEMAS}""",
    "trigger": f"""
        SELECT pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname IN {SCHEMAS} AND NOT t.tgisinternal""",
    "view": f"""
        SELECT format(E'%s.%s\\n%s', n.nspname, c.relname, pg_get_viewdef(c.oid))
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname IN {SCHEMAS} AND c.relkind = 'v'""",
    "default_acl": """
        SELECT format('%s in %s: %s %s', pg_get_userbyid(d.defaclrole),
                      coalesce(n.nspname, '(all schemas)'), d.defaclobjtype, d.defaclacl)
          FROM pg_default_acl d LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace""",
    "state": "SELECT format('%s', s) FROM ledger.state s",
    "actor": "SELECT format('%s', a) FROM ledger.actor a",
    "transition": """
        SELECT format('%s: %s -> %s by %s charge=%s note=%s', name, from_state, to_state, owner_role,
                      attempt_charge, note) FROM ledger.transition""",
    "meta": "SELECT format('%s', m) FROM ledger.meta m",
}


def catalog(url: str) -> dict[str, list[str]]:
    """Every object of Ledger's two schemas in ``url``, by kind, sorted."""
    listing: dict[str, list[str]] = {}
    with psycopg.connect(url) as conn:
        for kind, query in QUERIES.items():
            listing[kind] = sorted(r[0] for r in conn.execute(query))
    return listing
