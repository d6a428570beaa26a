"""A bucket on S3 or an S3-compatible server as the data store (``service.platform.datastore``).

The credentials are the secrets ``DATA_STORE_ACCESS_KEY_ID`` and
``DATA_STORE_SECRET_ACCESS_KEY`` (``service.platform.secrets``), read each time a store is made
and handed to the client alone; without them the client finds its own in the ``AWS_``
environment or the machine's role. No message names them: a store is shown by its URL.
"""

import io
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import TYPE_CHECKING, Any, BinaryIO

import obstore
from obstore.exceptions import BaseError as ObjectStoreError
from obstore.store import S3Store

from service.platform.errors import ActionError
from service.platform.secrets import secrets_of
from service.platform.settings import Settings
from service.platform.storage import PART_PREFIX, Staged, missing, relative_path

if TYPE_CHECKING:
    from obstore import ReadableFile
    from obstore.store import ClientConfig, S3Config

ACCESS_KEY_SECRET = "DATA_STORE_ACCESS_KEY_ID"
SECRET_KEY_SECRET = "DATA_STORE_SECRET_ACCESS_KEY"
STORE_ERRORS = (ObjectStoreError, OSError)
"""obstore raises its own errors, and Python's (``FileNotFoundError`` for a missing bucket or
object, ``OSError`` for a connection) where one fits."""


class _ObjectReader(io.RawIOBase):
    """A store's object as a raw stream, so ``io`` buffers and decodes it as it does a file."""

    def __init__(self, source: "ReadableFile") -> None:
        self._source = source

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._source.close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = memoryview(self._source.read(len(view)))
        view[: len(data)] = data
        return len(data)


class ObjectStore:
    """A bucket (and a prefix in it) on S3 or an S3-compatible server. A download is written
    under a part name, in parts as it arrives, then renamed once its name is known."""

    def __init__(self, store: S3Store, name: str) -> None:
        self.store = store
        self.name = name

    @contextmanager
    def staging(self, directory: str) -> Iterator[Staged]:
        partial = f"{directory}/{PART_PREFIX}{uuid.uuid4().hex}"
        written = False
        try:
            with _unavailable(self.name), obstore.open_writer(self.store, partial) as writer:
                staged = Staged(writer)
                yield staged
            written = True
            if staged.name is not None:
                with _unavailable(self.name):
                    obstore.rename(self.store, partial, f"{directory}/{staged.name}")
                written = False
        finally:
            if written:
                with suppress(*STORE_ERRORS):
                    obstore.delete(self.store, partial)

    @contextmanager
    def reader(self, path: str, action_name: str) -> Iterator[BinaryIO]:
        key = str(relative_path(path, action_name))
        with _unavailable(self.name):
            try:
                source = obstore.open_reader(self.store, key)
            except FileNotFoundError:
                raise missing(action_name, path, self.name) from None
            with io.BufferedReader(_ObjectReader(source)) as handle:
                yield handle


@contextmanager
def _unavailable(name: str) -> Iterator[None]:
    """An error of the store's server or of the way to it: the next attempt may succeed."""
    try:
        yield
    except STORE_ERRORS as exc:
        raise ActionError(
            f"the data store {name} failed: {type(exc).__name__}: {exc}",
            {"reason": "data_store", "store": name},
        ) from exc


def bucket_store(settings: Settings, url: str) -> ObjectStore:
    """A store for ``s3://bucket[/prefix]``; a failing server is given up on within half a
    minute, so that the step's own retry policy, not the client, decides what comes next."""
    secrets = secrets_of(settings)
    key_id, secret = secrets.value(ACCESS_KEY_SECRET, None), secrets.value(SECRET_KEY_SECRET, None)
    config: S3Config = {}
    if key_id and secret:
        config |= {"access_key_id": key_id, "secret_access_key": secret}
    if settings.data_store_endpoint:
        config["endpoint"] = settings.data_store_endpoint
    if settings.data_store_region:
        config["region"] = settings.data_store_region
    client: ClientConfig = {"connect_timeout": timedelta(seconds=10)}
    if (settings.data_store_endpoint or "").startswith("http://"):
        client["allow_http"] = True
    store = S3Store.from_url(
        url,
        config=config,
        client_options=client,
        retry_config={"max_retries": 3, "retry_timeout": timedelta(seconds=30)},
    )
    return ObjectStore(store, url.rstrip("/"))
