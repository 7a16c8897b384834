"""How Ledger's long-running parts run: one shape, one host.

* ``service`` -- the ``Service`` protocol (``run_once`` for tests and
  ``--once``, ``run(stop)`` until stopped) and ``Loop``, the base of every
  periodic service;
* ``host`` -- ``Host``, which runs a set of services as named tasks, handles
  SIGTERM/SIGINT once, notices a service that dies, and checks at exit that
  nothing was left running.
* ``commands`` -- ``service_command``, with which a command of the CLI
  declares itself a service (the host then stops it cleanly while it starts).

Every pause after a failure, here and below (the hub, the database), is
``ledger.backoff.backoff``. This package imports none of the services
(worker, verifier ...): they import it; ``ledger.roles.services`` builds them.
"""
