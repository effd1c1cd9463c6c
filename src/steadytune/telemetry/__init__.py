"""Telemetry: the worker's streams, the event log, the SQLite index, the system sampler,
the run's progress figures and the record of the environment it ran in."""
