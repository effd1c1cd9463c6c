"""Detectors: pure, torch-free, fed the records of :mod:`steadytune.records`.

- :class:`LiveDetector` runs them all on a live stream and returns
  :class:`Transition` objects (raised once, resolved once);
- :func:`detect` replays a finished run through the same engine;
- :class:`DetectConfig` holds every threshold (the ``detect:`` config key).
"""

from steadytune.config.detect import DetectConfig
from steadytune.detect.live import LiveDetector, Transition, format_transition
from steadytune.detect.offline import detect
from steadytune.kinds import ALL_KINDS, KINDS, KindInfo

__all__ = [
    "ALL_KINDS",
    "KINDS",
    "DetectConfig",
    "KindInfo",
    "LiveDetector",
    "Transition",
    "detect",
    "format_transition",
]
