"""The operator console: login sessions, the live queue view, the pages' routes."""
