"""Forensics: which data, which layer, can it be reproduced, is the record intact.

- :mod:`.inspect` — reload a step's samples by id and content hash and check them (torch-free)
- :mod:`.ckptdiff` — stream-compare two checkpoints, name the problem layer (via :mod:`.stread`)
- :mod:`.bundle` / :mod:`.replaystep` — minimal-repro bundles and their replay (:mod:`.unpack`: safe
  unpacking; :mod:`.bundlerun`: the run, config, checkpoint and samples a bundle points at)
- :mod:`.memprof` — process-tree memory growth (CUDA allocator snapshots: :mod:`steadytune.guard.memsnap`)
- :mod:`.timeline` — detectors and policy replayed over recorded telemetry
- :mod:`.audit` — the hash chain of ``events.jsonl``
- :mod:`.envdiff` — the environment a run started in (``env.json``, recorded by
  :mod:`steadytune.telemetry.runenv`) compared, and exported as pinned requirements
"""
