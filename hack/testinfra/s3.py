"""A minimal S3 client (path-style, AWS Signature Version 4) on the standard library, for test set-up and checks.

It covers what the tests need against MinIO (buckets, put/get/list/delete objects) and nothing more; the product
itself talks to S3 only through Spark's s3a. Errors raise :class:`S3Error` with the HTTP status and S3 error code.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

__all__ = ["S3Client", "S3Error"]

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Error(RuntimeError):
    def __init__(self, status: int, code: str, message: str, method: str, path: str) -> None:
        self.status, self.code = status, code
        super().__init__(f"S3 {method} {path}: HTTP {status} {code}: {message}")


def _quote(s: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(s, safe=safe)


class S3Client:
    def __init__(self, endpoint: str, access_key: str, secret_key: str, *, region: str = "us-east-1") -> None:
        self.endpoint = endpoint.rstrip("/")
        self.host = urllib.parse.urlsplit(self.endpoint).netloc
        self.access_key, self.secret_key, self.region = access_key, secret_key, region

    # ---- signing ---------------------------------------------------------------------------------------------
    def _request(
        self, method: str, path: str, *, query: dict[str, str] | None = None, body: bytes = b"", timeout: float = 30
    ) -> bytes:
        now = dt.datetime.now(dt.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(body).hexdigest()
        canonical_uri = _quote(path, safe="-_.~/")
        canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted((query or {}).items()))
        headers = {"host": self.host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canonical_headers = "".join(f"{k}:{headers[k]}\n" for k in sorted(headers))
        canonical = "\n".join([method, canonical_uri, canonical_query, canonical_headers, signed, payload_hash])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + self.secret_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
        )
        url = self.endpoint + canonical_uri + (f"?{canonical_query}" if canonical_query else "")
        req = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None, method=method)
        for k, v in headers.items():
            if k != "host":
                req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            code, message = "", raw.decode(errors="replace")[:300]
            try:
                root = ET.fromstring(raw)
                code = root.findtext("Code") or ""
                message = root.findtext("Message") or message
            except ET.ParseError:
                pass
            raise S3Error(e.code, code, message, method, path) from None

    # ---- operations ------------------------------------------------------------------------------------------
    def create_bucket(self, bucket: str, *, exist_ok: bool = True) -> None:
        try:
            self._request("PUT", f"/{bucket}")
        except S3Error as e:
            if not (exist_ok and e.code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")):
                raise

    def bucket_exists(self, bucket: str) -> bool:
        try:
            self._request("HEAD", f"/{bucket}")
            return True
        except S3Error as e:
            if e.status == 404:
                return False
            raise

    def put_object(self, bucket: str, key: str, data: bytes | str) -> None:
        self._request("PUT", f"/{bucket}/{key}", body=data.encode() if isinstance(data, str) else data)

    def get_object(self, bucket: str, key: str) -> bytes:
        return self._request("GET", f"/{bucket}/{key}")

    def delete_object(self, bucket: str, key: str) -> None:
        self._request("DELETE", f"/{bucket}/{key}")

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (ListObjectsV2, all pages), sorted."""
        keys: list[str] = []
        token = None
        while True:
            q = {"list-type": "2", "prefix": prefix}
            if token:
                q["continuation-token"] = token
            root = ET.fromstring(self._request("GET", f"/{bucket}", query=q))
            keys += [c.findtext(f"{_NS}Key") or "" for c in root.findall(f"{_NS}Contents")]
            if root.findtext(f"{_NS}IsTruncated") != "true":
                return sorted(keys)
            token = root.findtext(f"{_NS}NextContinuationToken")
