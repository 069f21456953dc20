"""Urgency and output-length predictors (transformers/torch)."""
