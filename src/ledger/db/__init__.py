"""The database layer: connections and sessions, the kernel of write functions, the named reads, migrations, the embedded server, the hub and the SQL itself (sql/)."""
