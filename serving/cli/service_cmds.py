"""Commands registered on serving.cli.apps (filled in by its owner)."""
