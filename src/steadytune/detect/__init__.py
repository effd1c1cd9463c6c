"""Detectors: pure, torch-free, fed the records of :mod:`steadytune.records`.

- :class:`LiveDetector` runs them all on a live stream and returns
  :class:`Transition` objects, one episode per anomaly that goes on or comes back
  (:mod:`.episodes`);
- :func:`detect` replays a finished run through the same engine;
- :class:`DetectConfig` holds every threshold (the ``detect:`` config key);
- :data:`KINDS` says what each anomaly kind means, its likely cause and the fix.

Every detector has one shape (:class:`~steadytune.detect.base.Detector`: records
in, findings out) and one entry in the registry (:mod:`.build`).
"""

from steadytune.config.detect import DetectConfig
from steadytune.detect.base import KindInfo
from steadytune.detect.build import KINDS
from steadytune.detect.live import LiveDetector, Transition, format_transition
from steadytune.detect.offline import detect

ALL_KINDS: tuple[str, ...] = tuple(KINDS)

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
