"""Contracts shared by the exporter, gateway, updater and local server: pydantic models and pure functions only."""
