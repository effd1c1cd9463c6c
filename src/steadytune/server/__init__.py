"""The host daemon: GPU ledger, memory-aware admission, a durable queue (torch-free).

See docs/server.md. ``ledger`` and ``admission`` are pure; ``queue`` owns the SQLite
file; ``daemon`` is the loop that samples, admits, starts, watches and adopts jobs.
"""
