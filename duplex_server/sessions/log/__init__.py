"""Where records are kept: the store interface, its memory, SQLite and Redis
backends, the record codec, leases, fencing and resume tokens.

A store knows a record's kind and its bytes, never what it means."""
