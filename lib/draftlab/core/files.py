"""Atomic file writes: a reader, or a crash, sees the old file or the new one, never half of one.

Every stage writes its results through these (temp file beside the target, then rename), so a
killed notebook or GPU step leaves nothing torn behind that a resumed run would trust.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp", prefix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `path` to write to; it replaces `path` when the block succeeds.

    A file or a folder may be written there (a folder replaces an existing one whole). On an
    exception the temporary is removed and `path` is left as it was. prefix "." hides the
    temporary from globs of the final name (training checkpoints).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(prefix + path.name + suffix)
    _remove(tmp)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if tmp.is_dir() and path.is_dir():
        shutil.rmtree(path)
    tmp.replace(path)


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write text or bytes to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def atomic_write_json(path: str | Path, obj, **dumps) -> Path:
    """json.dumps(obj, **dumps) written atomically."""
    return atomic_write(path, json.dumps(obj, **dumps))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
