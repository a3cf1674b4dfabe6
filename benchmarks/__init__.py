"""Benchmarks: bounded scripts run with ``python -m benchmarks.<name>``; each prints its figures and the command."""
