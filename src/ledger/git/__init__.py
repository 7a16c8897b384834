"""Ledger's own git: the hardened git it runs, repositories and remotes, bundles, protected paths and the diff's screen."""
