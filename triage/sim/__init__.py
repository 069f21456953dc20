"""Discrete-event simulation: traces in, per-token timestamps out, with the live policies."""
