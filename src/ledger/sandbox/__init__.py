"""The cell untrusted commands run in: bubblewrap, its init, the egress proxy, the command runner and redaction of what they print."""
