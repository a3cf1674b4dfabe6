"""Helpers that start real services (serve-local, Kafka, the gateway) on 127.0.0.1 for tests and benchmarks."""
