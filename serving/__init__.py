"""Serving layer: API, engine loop, backends, vLLM scheduler plugin, database, CLI."""
