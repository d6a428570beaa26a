"""The data store: where ``data.download`` puts files and ``data.parse`` reads them.

A job's steps run wherever a worker is free, so with workers on several hosts a parse runs
where its download may not have. The store is one place every worker reaches
(``FLOWBEAT_DATA_STORE``): a directory each host mounts (a shared volume), or an S3 bucket on
AWS or an S3-compatible server. Steps pass each other a path relative to the store, never a
worker's own path. Unset, the store is ``data_dir``, which is all one machine needs; a
bucket is ``service.platform.objectstore``'s.
"""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from service.platform.settings import Settings
from service.platform.storage import (
    PART_PREFIX,
    DataStore,
    Staged,
    bad_path,
    missing,
    relative_path,
)


class DirectoryStore:
    """A directory: ``data_dir``, or a volume every worker host mounts at the same path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = str(root)

    @contextmanager
    def staging(self, directory: str) -> Iterator[Staged]:
        target = self.root / directory
        target.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target, prefix=PART_PREFIX)
        try:
            with os.fdopen(fd, "wb") as handle:
                staged = Staged(handle)
                yield staged
            if staged.name is not None:
                os.replace(partial, target / staged.name)
        finally:
            Path(partial).unlink(missing_ok=True)

    @contextmanager
    def reader(self, path: str, action_name: str) -> Iterator[BinaryIO]:
        try:
            target = resolve_under(self.root, path, action_name, "data store")
        except FileNotFoundError:
            raise missing(action_name, path, self.name) from None
        with target.open("rb") as handle:
            yield handle


def resolve_under(base_dir: Path, path: object, action_name: str, base_name: str) -> Path:
    """The regular file ``path`` names under ``base_dir``, or ``FileNotFoundError``; symlinks
    are followed only while they stay inside, so a profile cannot read the worker's files."""
    relative = relative_path(path, action_name)
    base = base_dir.resolve()
    try:
        target = (base / relative).resolve(strict=True)
    except FileNotFoundError:
        raise
    except (OSError, RuntimeError) as exc:
        raise bad_path(f"{action_name}: cannot resolve {path!r}: {exc}", path) from exc
    if not target.is_relative_to(base):
        raise bad_path(f"{action_name}: {path!r} resolves outside the {base_name}", path)
    if not target.is_file():
        raise bad_path(f"{action_name}: {path!r} is not a regular file", path)
    return target


def data_store(settings: Settings) -> DataStore:
    """The store the settings name; made at each use, so that rotated credentials are read.
    The S3 client is imported only where a bucket is the store."""
    url = settings.data_store
    if url is None:
        return DirectoryStore(Path(settings.data_dir))
    if not url.startswith("s3://"):
        return DirectoryStore(Path(url.removeprefix("file://")))
    from service.platform.objectstore import bucket_store

    return bucket_store(settings, url)
