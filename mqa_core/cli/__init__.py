"""The ``mqa`` command: one module per subcommand, each building a dict then printing it."""
