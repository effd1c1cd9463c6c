"""Telemetry: the worker's streams, the event log, the SQLite index and the system sampler."""
