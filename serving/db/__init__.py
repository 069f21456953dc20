"""Audit database: models, sessions, the batched writer with its spool, the hash chain."""
