#!/usr/bin/env python3
"""A strict S3 test peer: the subset of the S3 API the Stitch store uses, with
what s3rver does not check.

- Every request must carry a valid AWS Signature Version 4 (header form). The
  expected signature is computed with botocore's own signer (Debian's
  python3-botocore), the reference implementation, from the request as it
  arrived; a mismatch is 403 SignatureDoesNotMatch, an unknown key 403
  InvalidAccessKeyId, a payload whose SHA-256 differs from its
  x-amz-content-sha256 400 XAmzContentSHA256Mismatch.
- Conditional writes are enforced as S3 does since 2024: PUT (and
  CompleteMultipartUpload) with `If-None-Match: *` fails 412
  PreconditionFailed when the key exists; with `If-Match: <etag>` when the
  key is absent (404 NoSuchKey) or its ETag differs (412).

Objects live in memory. Routes: PUT/HEAD bucket; PUT/GET (Range)/HEAD/DELETE
object; ListObjectsV2 (prefix, delimiter, continuation-token, max-keys); multipart
create, upload part, complete, abort.

Usage: s3_strict_peer.py [--port P] [--access-key K] [--secret-key S]
Prints `http://127.0.0.1:<port>` on its first line once it listens.
"""

import argparse
import hashlib
import re
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request,\s*"
    r"SignedHeaders=([a-z0-9;\-]+),\s*Signature=([0-9a-f]{64})$"
)


class Store:
    def __init__(self):
        self.lock = threading.Lock()
        self.buckets = {}  # name -> {key: (bytes, etag)}
        self.uploads = {}  # upload id -> (bucket, key, {part: (bytes, etag)})
        self.next_upload = 0


class S3Error(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def etag_of(data):
    return '"' + hashlib.md5(data).hexdigest() + '"'


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store = None
    access_key = None
    secret_key = None

    def log_message(self, *args):
        pass

    # -- plumbing -----------------------------------------------------------

    def send(self, status, body=b"", headers=None, content_type="application/xml"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body or status not in (204, 304):
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def fail(self, e):
        body = (
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>"
            % (escape(e.code), escape(e.message))
        ).encode()
        self.send(e.status, b"" if self.command == "HEAD" else body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def verify(self, data):
        m = AUTH.match(self.headers.get("Authorization", ""))
        if not m:
            raise S3Error(403, "AccessDenied", "no SigV4 Authorization header")
        access, day, region, signed, signature = m.groups()
        if access != self.access_key:
            raise S3Error(403, "InvalidAccessKeyId", "unknown access key " + access)
        amz_date = self.headers.get("X-Amz-Date", "")
        if not amz_date.startswith(day):
            raise S3Error(403, "SignatureDoesNotMatch", "X-Amz-Date does not match the scope")
        names = signed.split(";")
        if "host" not in names or "x-amz-date" not in names:
            raise S3Error(403, "AccessDenied", "host and x-amz-date must be signed")
        headers = {}
        for name in names:
            value = self.headers.get(name)
            if value is None:
                raise S3Error(403, "SignatureDoesNotMatch", "signed header %s is missing" % name)
            headers[name] = value
        claimed = self.headers.get("x-amz-content-sha256", "")
        if claimed != "UNSIGNED-PAYLOAD" and claimed != hashlib.sha256(data).hexdigest():
            raise S3Error(400, "XAmzContentSHA256Mismatch", "the body's SHA-256 is not x-amz-content-sha256")
        request = AWSRequest(method=self.command, url="http://" + headers["host"] + self.path,
                             headers=headers, data=data)
        request.context["timestamp"] = amz_date
        signer = S3SigV4Auth(Credentials(self.access_key, self.secret_key), "s3", region)
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        if expected != signature:
            raise S3Error(403, "SignatureDoesNotMatch",
                          "The request signature we calculated does not match the signature you provided.")

    def target(self):
        parts = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parts.path)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket, key, {k: v[0] for k, v in query.items()}

    def check_conditions(self, objects, key):
        none_match = self.headers.get("If-None-Match")
        match = self.headers.get("If-Match")
        if none_match is not None:
            if none_match.strip() != "*":
                raise S3Error(501, "NotImplemented", "If-None-Match takes only *")
            if key in objects:
                raise S3Error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
        if match is not None:
            if key not in objects:
                raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
            if objects[key][1] != match.strip():
                raise S3Error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")

    def handle_any(self):
        data = self.body()
        try:
            self.verify(data)
            self.route(data)
        except S3Error as e:
            self.fail(e)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

    # -- the API ------------------------------------------------------------

    def route(self, data):
        bucket, key, q = self.target()
        st = self.store
        with st.lock:
            if not key:
                return self.bucket_op(bucket, q)
            objects = st.buckets.get(bucket)
            if objects is None:
                raise S3Error(404, "NoSuchBucket", "The specified bucket does not exist")
            if self.command == "POST" and "uploads" in q:
                st.next_upload += 1
                uid = "u%d" % st.next_upload
                st.uploads[uid] = (bucket, key, {})
                return self.send(200, ("<InitiateMultipartUploadResult><Bucket>%s</Bucket><Key>%s</Key>"
                                       "<UploadId>%s</UploadId></InitiateMultipartUploadResult>"
                                       % (escape(bucket), escape(key), uid)).encode())
            if "uploadId" in q:
                return self.multipart(objects, bucket, key, q, data)
            if self.command == "PUT":
                self.check_conditions(objects, key)
                tag = etag_of(data)
                objects[key] = (data, tag)
                return self.send(200, headers={"ETag": tag})
            if self.command in ("GET", "HEAD"):
                if key not in objects:
                    raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
                content, tag = objects[key]
                rng = self.headers.get("Range")
                if rng and self.command == "GET":
                    m = re.match(r"bytes=(\d+)-(\d+)$", rng)
                    if not m:
                        raise S3Error(400, "InvalidRange", "unsupported Range " + rng)
                    first, last = int(m.group(1)), min(int(m.group(2)), len(content) - 1)
                    if first >= len(content):
                        raise S3Error(416, "InvalidRange", "The requested range is not satisfiable")
                    return self.send(206, content[first:last + 1],
                                     {"ETag": tag, "Content-Range": "bytes %d-%d/%d" % (first, last, len(content))},
                                     "application/octet-stream")
                if self.command == "HEAD":
                    self.send_response(200)
                    self.send_header("ETag", tag)
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    return None
                return self.send(200, content, {"ETag": tag}, "application/octet-stream")
            if self.command == "DELETE":
                objects.pop(key, None)
                return self.send(204)
        raise S3Error(405, "MethodNotAllowed", self.command + " is not allowed here")

    def bucket_op(self, bucket, q):
        st = self.store
        if self.command == "PUT":
            if bucket in st.buckets:
                raise S3Error(409, "BucketAlreadyOwnedByYou", "Your previous request to create the named bucket succeeded")
            st.buckets[bucket] = {}
            return self.send(200)
        if bucket not in st.buckets:
            raise S3Error(404, "NoSuchBucket", "The specified bucket does not exist")
        if self.command == "HEAD":
            return self.send(200)
        if self.command == "GET" and q.get("list-type") == "2":
            prefix = q.get("prefix", "")
            delimiter = q.get("delimiter", "")
            after = q.get("continuation-token") or q.get("start-after") or ""
            limit = max(1, min(1000, int(q.get("max-keys", "1000"))))
            # Keys, and with a delimiter the common prefixes that stand for
            # the keys under them, in order; each counts once toward max-keys.
            entries = {}
            for k in st.buckets[bucket]:
                if not k.startswith(prefix):
                    continue
                cut = k.find(delimiter, len(prefix)) if delimiter else -1
                name = k[:cut + len(delimiter)] if cut >= 0 else k
                entries[name] = cut >= 0
            names = sorted(n for n in entries if n > after)
            page, more = names[:limit], len(names) > limit
            items = ""
            for n in page:
                if entries[n]:
                    items += "<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % escape(n)
                else:
                    content, tag = st.buckets[bucket][n]
                    items += "<Contents><Key>%s</Key><Size>%d</Size><ETag>%s</ETag></Contents>" % (
                        escape(n), len(content), escape(tag))
            token = "<NextContinuationToken>%s</NextContinuationToken>" % escape(page[-1]) if more else ""
            return self.send(200, ("<ListBucketResult><Name>%s</Name><Prefix>%s</Prefix><KeyCount>%d</KeyCount>"
                                   "<MaxKeys>%d</MaxKeys><IsTruncated>%s</IsTruncated>%s%s</ListBucketResult>"
                                   % (escape(bucket), escape(prefix), len(page), limit,
                                      "true" if more else "false", token, items)).encode())
        raise S3Error(405, "MethodNotAllowed", self.command + " on a bucket is not allowed here")

    def multipart(self, objects, bucket, key, q, data):
        st = self.store
        uid = q["uploadId"]
        upload = st.uploads.get(uid)
        if upload is None or upload[0] != bucket or upload[1] != key:
            raise S3Error(404, "NoSuchUpload", "The specified upload does not exist.")
        parts = upload[2]
        if self.command == "PUT":
            number = int(q.get("partNumber", "0"))
            if not 1 <= number <= 10000:
                raise S3Error(400, "InvalidArgument", "partNumber must be 1..10000")
            tag = etag_of(data)
            parts[number] = (data, tag)
            return self.send(200, headers={"ETag": tag})
        if self.command == "DELETE":
            del st.uploads[uid]
            return self.send(204)
        if self.command == "POST":
            listed = re.findall(rb"<PartNumber>(\d+)</PartNumber>\s*<ETag>([^<]+)</ETag>", data)
            if not listed:
                raise S3Error(400, "MalformedXML", "no parts listed")
            content, digests = b"", b""
            previous = 0
            for n, tag in listed:
                n = int(n)
                tag = tag.decode().replace("&quot;", '"')
                if n <= previous or n not in parts or parts[n][1] != tag:
                    raise S3Error(400, "InvalidPart", "part %d is missing or its ETag differs" % n)
                previous = n
                content += parts[n][0]
                digests += hashlib.md5(parts[n][0]).digest()
            self.check_conditions(objects, key)
            tag = '"%s-%d"' % (hashlib.md5(digests).hexdigest(), len(listed))
            objects[key] = (content, tag)
            del st.uploads[uid]
            return self.send(200, ("<CompleteMultipartUploadResult><Bucket>%s</Bucket><Key>%s</Key>"
                                   "<ETag>%s</ETag></CompleteMultipartUploadResult>"
                                   % (escape(bucket), escape(key), escape(tag))).encode())
        raise S3Error(405, "MethodNotAllowed", self.command + " on an upload is not allowed here")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--access-key", default="STRICT")
    ap.add_argument("--secret-key", default="strict-secret-key")
    args = ap.parse_args()
    Handler.store = Store()
    Handler.access_key = args.access_key
    Handler.secret_key = args.secret_key
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("http://127.0.0.1:%d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
