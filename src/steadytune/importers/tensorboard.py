"""TensorBoard event files (``events.out.tfevents.*``), a file or a directory of them.

Scalars come as ``simple_value`` (TF1, tensorboardX, PyTorch) or as a scalar
tensor (TF2); both are read. The tag's last path part decides the metric for
common names (``train/loss`` -> loss). TensorBoard is imported only here, and
only when such a file is read.
"""

from __future__ import annotations

from pathlib import Path

from steadytune.importers.format import LogFormat
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog
from steadytune.regularfile import open_regular

FORMAT = "tensorboard"
PREFIX = "events.out.tfevents"


def sniff_path(path: Path) -> bool:
    """An events file by its name, or by its content: a TFRecord whose first event names the
    event format (``brain.Event:2``), for a file that was renamed or copied under another name."""
    if path.is_dir():
        return any(path.glob(f"**/{PREFIX}*"))
    if path.name.startswith(PREFIX):
        return True
    try:
        with open_regular(path, "rb") as f:
            return b"brain.Event:" in f.read(64)
    except OSError:
        return False


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.glob(f"**/{PREFIX}*"))
    return [path]


def _scalar(value: object) -> float | None:
    if value.HasField("simple_value"):  # type: ignore[attr-defined]
        return float(value.simple_value)  # type: ignore[attr-defined]
    if value.HasField("tensor"):  # type: ignore[attr-defined]
        from tensorboard.util import tensor_util

        arr = tensor_util.make_ndarray(value.tensor)  # type: ignore[attr-defined]
        if arr.size == 1 and arr.dtype.kind in "fiu":
            return float(arr.reshape(-1)[0])
    return None


def read(path: Path) -> Series:
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError as e:  # optional dependency
        raise UnreadableLog("reading TensorBoard files needs: pip install 'steadytune[tensorboard]'") from e
    b = SeriesBuilder(str(path), FORMAT)
    for file in _files(path):
        try:
            for event in EventFileLoader(str(file)).Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    x = _scalar(value)
                    if x is not None:
                        b.add(int(event.step), value.tag, x)
        except Exception as e:  # a torn or foreign file: say which, keep the reason short
            raise UnreadableLog(f"cannot read TensorBoard events in {file.name}: {type(e).__name__}") from e
    if not len(b):
        raise UnreadableLog("no scalar summaries in the TensorBoard events")
    return b.build(require=("loss", "eval_loss", "grad_norm"))


LOG_FORMAT = LogFormat(FORMAT, order=50, read=read, sniff_path=sniff_path)
