"""The ``modelhub`` command line: click commands that call the daemon through ``Client``."""
