"""Forensics: which data, which layer, can it be reproduced, is the record intact.

- :mod:`.inspect` — reload a step's samples by id and content hash and check them (torch-free)
- :mod:`.ckptdiff` — stream-compare two checkpoints, name the problem layer (via :mod:`.stread`)
- :mod:`.bundle` / :mod:`.replaystep` — minimal-repro bundles and their replay
- :mod:`.memprof` / :mod:`.memsnap` — process-tree memory growth; CUDA allocator snapshots
- :mod:`.gradflow` — dead, vanishing and exploding layers from recorded gradient flow
- :mod:`.timeline` — detectors and policy replayed over recorded telemetry
- :mod:`.audit` — the hash chain of ``events.jsonl``
- :mod:`.envsnap` / :mod:`.runenv` / :mod:`.envdiff` / :mod:`.gitstate` — the environment a run started in
  (``env.json``): recorded, compared, exported as pinned requirements; the git state of the working tree
"""
