"""``python -m modelhub``: the same as the ``modelhub`` command."""

from modelhub.cli.main import main

if __name__ == "__main__":
    main()
