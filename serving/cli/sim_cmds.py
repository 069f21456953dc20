"""Simulator and policy benchmark commands."""
