"""The server under test: ``start`` (the one way to start one: in this process, or a child process on a free
loopback port), ``hash_server`` (a child serving the weightless ``hash_encoder``), ``toy_index``."""
