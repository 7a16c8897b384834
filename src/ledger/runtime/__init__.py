"""How Ledger's long-running parts run: one shape, one host.

* ``backoff`` -- the one pause after consecutive failures, used by every loop,
  the hub's reconnects, the database's retries and the host's restarts;
* ``service`` -- the ``Service`` protocol (``run_once`` for tests and
  ``--once``, ``run(stop)`` until stopped) and ``Loop``, the base of every
  periodic service;
* ``host`` -- ``Host``, which runs a set of services as named tasks, handles
  SIGTERM/SIGINT once, notices a service that dies, and checks at exit that
  nothing was left running.

This package imports none of the services (worker, verifier ...): they import
it. Nothing is re-exported here, so ``ledger.database`` can use ``backoff``
without pulling in the rest.
"""
