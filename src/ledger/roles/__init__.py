"""The roles: the worker and its attempt, the verifier, the dispatcher, the sensors, maintenance (reaper, trimmer, gc), the registry of live processes and the services that assemble them."""
