"""boto3 against kura's S3 listener: what R2's users do with the SDK, each check a real request.

Run by the compat suite (s3_clients.rs) with KURA_S3_ENDPOINT, AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY set. CHECKSUMS picks botocore's checksum mode: when_supported (the
default since boto3 1.36, CRC32 on every upload) or when_required. With KURA_S3_ENDPOINTS (a
kura cluster's nodes, comma-separated; cluster.rs), each call goes to the next node in turn.
"""

import base64
import hashlib
import os
import sys
import urllib.error
import urllib.request

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT = os.environ["KURA_S3_ENDPOINT"]
ENDPOINTS = os.environ.get("KURA_S3_ENDPOINTS", ENDPOINT).split(",")
MODE = os.environ.get("CHECKSUMS", "when_supported")


def client(endpoint):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="auto",
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            request_checksum_calculation=MODE,
            response_checksum_validation=MODE,
        ),
    )


class Rotating:
    """Each call through the next node of a cluster."""

    def __init__(self, endpoints):
        self.clients = [client(e) for e in endpoints]
        self.calls = 0

    def __getattr__(self, name):
        self.calls += 1
        return getattr(self.clients[self.calls % len(self.clients)], name)


s3 = Rotating(ENDPOINTS) if len(ENDPOINTS) > 1 else client(ENDPOINT)


def expect_error(code, status, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except ClientError as e:
        got = (e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
        assert got == (code, status), f"expected {code}/{status}, got {got}: {e}"
        return e
    raise AssertionError(f"expected {code}/{status}, the call succeeded")


bucket = f"boto-{MODE.replace('_', '-')}"
s3.create_bucket(Bucket=bucket)
expect_error("BucketAlreadyOwnedByYou", 409, s3.create_bucket, Bucket=bucket)
assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
s3.head_bucket(Bucket=bucket)
for extra in ("a", "b", "c"):
    s3.create_bucket(Bucket=f"{bucket}-page-{extra}")
names, token = [], None
while True:
    kwargs = {"MaxBuckets": 2, "Prefix": f"{bucket}-page-"}
    if token:
        kwargs["ContinuationToken"] = token
    page = s3.list_buckets(**kwargs)
    names += [b["Name"] for b in page["Buckets"]]
    token = page.get("ContinuationToken")
    if not token:
        break
assert names == [f"{bucket}-page-{x}" for x in "abc"], names
for extra in ("a", "b", "c"):
    s3.delete_bucket(Bucket=f"{bucket}-page-{extra}")
expect_error("404", 404, s3.head_bucket, Bucket="no-such-bucket")

# Metadata round trip.
body = b"hello, kura\n"
put = s3.put_object(
    Bucket=bucket,
    Key="docs/readme.txt",
    Body=body,
    ContentType="text/plain; charset=utf-8",
    ContentLanguage="en",
    ContentDisposition='attachment; filename="readme.txt"',
    CacheControl="max-age=60",
    Metadata={"owner": "alice", "purpose": "test"},
)
assert put["ETag"] == '"%s"' % hashlib.md5(body).hexdigest(), put["ETag"]
head = s3.head_object(Bucket=bucket, Key="docs/readme.txt")
assert head["ContentLength"] == len(body)
assert head["ContentType"] == "text/plain; charset=utf-8"
assert head["ContentLanguage"] == "en"
assert head["ContentDisposition"] == 'attachment; filename="readme.txt"'
assert head["CacheControl"] == "max-age=60"
assert head["Metadata"] == {"owner": "alice", "purpose": "test"}, head["Metadata"]
got = s3.get_object(Bucket=bucket, Key="docs/readme.txt")
assert got["Body"].read() == body

# A wrong secret: R2's SignatureDoesNotMatch shows the string it signed and the canonical
# request, which must be exactly what the client signed.
import logging


class Grab(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


grab = Grab()
auth_log = logging.getLogger("botocore.auth")
auth_log.setLevel(logging.DEBUG)
auth_log.addHandler(grab)
wrong = boto3.client(
    "s3",
    endpoint_url=ENDPOINT,
    region_name="auto",
    aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
    aws_secret_access_key="not-the-secret",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
)
e = expect_error("SignatureDoesNotMatch", 403, wrong.get_object, Bucket=bucket, Key="docs/readme.txt", Range="bytes=0-1")
auth_log.removeHandler(grab)
signed = [m.split("\n", 1)[1] for m in grab.messages if m.startswith("StringToSign:")][-1]
canonical = [m.split("\n", 1)[1] for m in grab.messages if m.startswith("CanonicalRequest:")][-1]
error = e.response["Error"]
assert error["StringToSign"] == signed, (error["StringToSign"], signed)
assert error["CanonicalRequest"] == canonical, (error["CanonicalRequest"], canonical)
assert error["StringToSignBytes"].split()[0] == "41", error  # 'A' of AWS4-HMAC-SHA256
assert len(error["SignatureProvided"]) == 64, error

# Unicode metadata travels RFC 2047-encoded, and is stored and counted decoded.
s3.put_object(Bucket=bucket, Key="unicode-meta", Body=b"x", Metadata={"city": "=?UTF-8?B?WsO8cmljaA==?="})
meta = s3.head_object(Bucket=bucket, Key="unicode-meta")["Metadata"]
assert meta == {"city": "=?UTF-8?B?WsO8cmljaA==?="}, meta

# Ranges.
part = s3.get_object(Bucket=bucket, Key="docs/readme.txt", Range="bytes=0-4")
assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
assert part["ContentRange"] == f"bytes 0-4/{len(body)}", part["ContentRange"]
assert part["Body"].read() == b"hello"
assert s3.get_object(Bucket=bucket, Key="docs/readme.txt", Range="bytes=-5")["Body"].read() == body[-5:]
assert s3.get_object(Bucket=bucket, Key="docs/readme.txt", Range="bytes=7-999")["Body"].read() == body[7:]
expect_error("InvalidRange", 416, s3.get_object, Bucket=bucket, Key="docs/readme.txt", Range="bytes=100-200")
e = expect_error("InvalidArgument", 400, s3.get_object, Bucket=bucket, Key="docs/readme.txt", Range="bytes=0-1,3-4")
assert e.response["Error"]["Message"].startswith("range must be in format 'bytes=start-end'"), e.response
e = expect_error("InvalidArgument", 400, s3.get_object, Bucket=bucket, Key="docs/readme.txt", Range="bytes=5-2")
assert e.response["Error"]["Message"] == "range must be positive.", e.response

# Conditionals.
etag = put["ETag"]
expect_error("PreconditionFailed", 412, s3.put_object, Bucket=bucket, Key="docs/readme.txt", Body=b"x", IfNoneMatch="*")
s3.put_object(Bucket=bucket, Key="fresh", Body=b"first", IfNoneMatch="*")
expect_error("PreconditionFailed", 412, s3.get_object, Bucket=bucket, Key="docs/readme.txt", IfMatch='"0000"')
assert s3.get_object(Bucket=bucket, Key="docs/readme.txt", IfMatch=etag)["Body"].read() == body
expect_error("304", 304, s3.get_object, Bucket=bucket, Key="docs/readme.txt", IfNoneMatch=etag)

# Unicode keys and the 1,024-byte limit.
for key in ["ünïcödé/ファイル.txt", "emoji/🎉 party.txt", "spaces and+plus%percent.txt"]:
    s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == key.encode()
s3.put_object(Bucket=bucket, Key="k" * 1024, Body=b"longest")
try:
    s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"too long")
    raise AssertionError("a 1,025-byte key was accepted")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 400, e.response
listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
assert "ünïcödé/ファイル.txt" in listed and "spaces and+plus%percent.txt" in listed, listed
assert "k" * 1025 not in listed

# Delimiter listing and pagination.
for i in range(5):
    s3.put_object(Bucket=bucket, Key=f"page/{i}", Body=b"p")
    s3.put_object(Bucket=bucket, Key=f"page/sub{i}/x", Body=b"p")
top = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["docs/", "emoji/", "page/", "ünïcödé/"], top["CommonPrefixes"]
keys, token, pages = [], None, 0
while True:
    kwargs = {"Bucket": bucket, "Prefix": "page/", "Delimiter": "/", "MaxKeys": 3}
    if token:
        kwargs["ContinuationToken"] = token
    page = s3.list_objects_v2(**kwargs)
    pages += 1
    keys += [o["Key"] for o in page.get("Contents", [])] + [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    assert page["KeyCount"] <= 3
    if not page["IsTruncated"]:
        break
    token = page["NextContinuationToken"]
assert sorted(keys) == sorted([f"page/{i}" for i in range(5)] + [f"page/sub{i}/" for i in range(5)]), keys
assert pages == 4, pages
v1 = s3.list_objects(Bucket=bucket, Prefix="page/", MaxKeys=2)
assert v1["IsTruncated"] and [o["Key"] for o in v1["Contents"]] == ["page/0", "page/1"]
v1 = s3.list_objects(Bucket=bucket, Prefix="page/", Marker=v1["NextMarker"], MaxKeys=2)
assert [o["Key"] for o in v1["Contents"]] == ["page/2", "page/3"]

# Copy, with the metadata directive.
s3.copy_object(Bucket=bucket, Key="copy-same", CopySource={"Bucket": bucket, "Key": "docs/readme.txt"})
assert s3.head_object(Bucket=bucket, Key="copy-same")["Metadata"] == {"owner": "alice", "purpose": "test"}
s3.copy_object(
    Bucket=bucket,
    Key="copy-new",
    CopySource={"Bucket": bucket, "Key": "docs/readme.txt"},
    MetadataDirective="REPLACE",
    Metadata={"owner": "bob"},
    ContentType="text/markdown",
)
copied = s3.head_object(Bucket=bucket, Key="copy-new")
assert copied["Metadata"] == {"owner": "bob"} and copied["ContentType"] == "text/markdown"
assert s3.get_object(Bucket=bucket, Key="copy-new")["Body"].read() == body
expect_error("NoSuchKey", 404, s3.copy_object, Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "missing"})

# Multipart: 5 MiB parts, the last smaller; ETag of the part MD5s; listing parts; abort.
MiB = 1024 * 1024
parts_data = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(MiB // 2)]
upload = s3.create_multipart_upload(Bucket=bucket, Key="multi", ContentType="application/x-test")
uid = upload["UploadId"]
etags = []
for n, data in enumerate(parts_data, start=1):
    etags.append(s3.upload_part(Bucket=bucket, Key="multi", UploadId=uid, PartNumber=n, Body=data)["ETag"])
listed_parts = s3.list_parts(Bucket=bucket, Key="multi", UploadId=uid)["Parts"]
assert [p["PartNumber"] for p in listed_parts] == [1, 2, 3]
assert uid in [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
done = s3.complete_multipart_upload(
    Bucket=bucket,
    Key="multi",
    UploadId=uid,
    MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, start=1)]},
)
md5s = b"".join(hashlib.md5(d).digest() for d in parts_data)
assert done["ETag"] == '"%s-3"' % hashlib.md5(md5s).hexdigest(), done["ETag"]
whole = b"".join(parts_data)
obj = s3.get_object(Bucket=bucket, Key="multi")
assert obj["ContentType"] == "application/x-test"
assert obj["Body"].read() == whole
span = s3.get_object(Bucket=bucket, Key="multi", Range=f"bytes={5 * MiB - 10}-{5 * MiB + 9}")["Body"].read()
assert span == whole[5 * MiB - 10 : 5 * MiB + 10]
expect_error("NoSuchUpload", 404, s3.upload_part, Bucket=bucket, Key="multi", UploadId=uid, PartNumber=4, Body=b"x")

small = s3.create_multipart_upload(Bucket=bucket, Key="small")["UploadId"]
e1 = s3.upload_part(Bucket=bucket, Key="small", UploadId=small, PartNumber=1, Body=b"a" * 100)["ETag"]
e2 = s3.upload_part(Bucket=bucket, Key="small", UploadId=small, PartNumber=2, Body=b"b" * 100)["ETag"]
expect_error(
    "EntityTooSmall", 400, s3.complete_multipart_upload, Bucket=bucket, Key="small", UploadId=small,
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
)
expect_error(
    "InvalidPart", 400, s3.complete_multipart_upload, Bucket=bucket, Key="small", UploadId=small,
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]},
)
s3.abort_multipart_upload(Bucket=bucket, Key="small", UploadId=small)
expect_error("NoSuchUpload", 404, s3.list_parts, Bucket=bucket, Key="small", UploadId=small)

# Bad digests change nothing.
import base64
expect_error(
    "BadDigest", 400, s3.put_object, Bucket=bucket, Key="fresh", Body=b"changed",
    ContentMD5=base64.b64encode(hashlib.md5(b"other").digest()).decode(),
)
assert s3.get_object(Bucket=bucket, Key="fresh")["Body"].read() == b"first"

# What R2 does not implement is refused (501) in R2's words; canned ACLs are accepted no-ops.
e = expect_error("NotImplemented", 501, s3.put_object, Bucket=bucket, Key="tagged", Body=b"x", Tagging="a=b")
assert e.response["Error"]["Message"] == "Header 'x-amz-tagging' with value 'a=b' not implemented", e.response
e = expect_error("NotImplemented", 501, s3.get_object_acl, Bucket=bucket, Key="fresh")
assert e.response["Error"]["Message"] == "GetObjectAcl not implemented", e.response
s3.put_object(Bucket=bucket, Key="acl", Body=b"x", ACL="private")
# R2's fixed answers to bucket configuration reads.
rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256", rules
assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
expect_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=bucket)
expect_error("ObjectLockConfigurationNotFoundError", 404, s3.get_object_lock_configuration, Bucket=bucket)
expect_error("NoSuchCORSConfiguration", 404, s3.get_bucket_cors, Bucket=bucket)
s3.delete_object(Bucket=bucket, Key="acl")

# Oversized metadata and malformed XML: clear S3 errors, nothing stored.
expect_error("MetadataTooLarge", 400, s3.put_object, Bucket=bucket, Key="meta", Body=b"x", Metadata={"big": "v" * 9000})
try:
    s3.head_object(Bucket=bucket, Key="meta")
    raise AssertionError("an object with oversized metadata was stored")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
import urllib.request as _request

credentials = boto3.Session().get_credentials()


def raw(method, path, body, headers=None):
    """A signed request with a body botocore would never send."""
    request = AWSRequest(method=method, url=f"{ENDPOINT}{path}", data=body, headers=headers or {})
    request.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    S3SigV4Auth(credentials, "s3", "auto").add_auth(request)
    prepared = _request.Request(request.url, data=body, method=method, headers=dict(request.headers.items()))
    try:
        with _request.urlopen(prepared) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# R2's cf-create-bucket-if-missing makes the bucket on first write.
implicit = f"{bucket}-implicit"
status, _ = raw("PUT", f"/{implicit}/first", b"made it", {"cf-create-bucket-if-missing": "true"})
assert status == 200, status
assert s3.get_object(Bucket=implicit, Key="first")["Body"].read() == b"made it"
s3.delete_object(Bucket=implicit, Key="first")
s3.delete_bucket(Bucket=implicit)
status, _ = raw("PUT", f"/{implicit}/first", b"no bucket")
assert status == 404, status

# R2 takes a POST on an object key as a PutObject.
status, _ = raw("POST", f"/{bucket}/posted/by%20post", b"posted bytes", {"Content-Type": "text/x-posted"})
assert status == 200, status
posted = s3.get_object(Bucket=bucket, Key="posted/by post")
assert (posted["Body"].read(), posted["ContentType"]) == (b"posted bytes", "text/x-posted")

status, text = raw("POST", f"/{bucket}?delete", b"<Delete><Object><Key>fresh</Key></Object")
assert status == 400 and "<Code>MalformedXML</Code>" in text, (status, text)
assert s3.get_object(Bucket=bucket, Key="fresh")["Body"].read() == b"first"
upload = s3.create_multipart_upload(Bucket=bucket, Key="xml")["UploadId"]
status, text = raw("POST", f"/{bucket}/xml?uploadId={upload}", b"<CompleteMultipartUpload><Part>oops")
assert status == 400 and "<Code>MalformedXML</Code>" in text, (status, text)
status, text = raw("POST", f"/{bucket}/xml?uploadId={upload}", b"<CompleteMultipartUpload></CompleteMultipartUpload>")
assert status == 400 and "<Code>MalformedXML</Code>" in text, (status, text)
s3.abort_multipart_upload(Bucket=bucket, Key="xml", UploadId=upload)

# Parts may be listed out of order (R2 sorts them), but in the order given every part before the
# last must be big enough; a repeated part number is refused.
upload = s3.create_multipart_upload(Bucket=bucket, Key="order")["UploadId"]
five = 5 * 1024 * 1024
p1 = s3.upload_part(Bucket=bucket, Key="order", UploadId=upload, PartNumber=1, Body=b"1" * five)["ETag"]
p2 = s3.upload_part(Bucket=bucket, Key="order", UploadId=upload, PartNumber=2, Body=b"2" * five)["ETag"]
p3 = s3.upload_part(Bucket=bucket, Key="order", UploadId=upload, PartNumber=3, Body=b"3" * 10)["ETag"]
expect_error(
    "InvalidPart", 400, s3.complete_multipart_upload, Bucket=bucket, Key="order", UploadId=upload,
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1}, {"PartNumber": 1, "ETag": p1}]},
)
expect_error(
    "EntityTooSmall", 400, s3.complete_multipart_upload, Bucket=bucket, Key="order", UploadId=upload,
    MultipartUpload={"Parts": [{"PartNumber": 3, "ETag": p3}, {"PartNumber": 1, "ETag": p1}]},
)
s3.complete_multipart_upload(
    Bucket=bucket, Key="order", UploadId=upload,
    MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": p2}, {"PartNumber": 1, "ETag": p1}, {"PartNumber": 3, "ETag": p3}]},
)
assert s3.head_object(Bucket=bucket, Key="order")["ContentLength"] == 2 * five + 10
part3 = s3.get_object(Bucket=bucket, Key="order", PartNumber=3)
assert part3["Body"].read() == b"3" * 10 and part3["PartsCount"] == 3

# Multipart checksums, as R2 gives them: SHA-256 of the parts' SHA-256s ("-N", COMPOSITE), and
# CRC-64/NVME of the whole object (FULL_OBJECT), which the server keeps for every part even
# when the client sends none (botocore cannot compute CRC-64/NVME without awscrt).
upload = s3.create_multipart_upload(Bucket=bucket, Key="summed", ChecksumAlgorithm="SHA256")
assert upload["ChecksumAlgorithm"] == "SHA256" and upload["ChecksumType"] == "COMPOSITE", upload
first, second = b"s" * five, b"tail of the summed object"
parts = []
for number, data in [(1, first), (2, second)]:
    part = s3.upload_part(
        Bucket=bucket, Key="summed", UploadId=upload["UploadId"], PartNumber=number, Body=data, ChecksumAlgorithm="SHA256"
    )
    assert part["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode(), part
    parts.append({"PartNumber": number, "ETag": part["ETag"], "ChecksumSHA256": part["ChecksumSHA256"]})
wrong = [dict(parts[0], ChecksumSHA256=base64.b64encode(b"\0" * 32).decode()), parts[1]]
expect_error(
    "InvalidPart", 400, s3.complete_multipart_upload, Bucket=bucket, Key="summed", UploadId=upload["UploadId"],
    MultipartUpload={"Parts": wrong},
)
done = s3.complete_multipart_upload(
    Bucket=bucket, Key="summed", UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
)
composite = base64.b64encode(
    hashlib.sha256(hashlib.sha256(first).digest() + hashlib.sha256(second).digest()).digest()
).decode() + "-2"
assert (done["ChecksumSHA256"], done["ChecksumType"]) == (composite, "COMPOSITE"), done
head = s3.head_object(Bucket=bucket, Key="summed", ChecksumMode="ENABLED")
assert (head["ChecksumSHA256"], head["ChecksumType"]) == (composite, "COMPOSITE"), head


def crc64nvme(data):
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ (0x9A6C9329AC4BC9B5 if crc & 1 else 0)
        table.append(crc)
    crc = 0xFFFFFFFFFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return base64.b64encode((crc ^ 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")).decode()


upload = s3.create_multipart_upload(Bucket=bucket, Key="crc", ChecksumAlgorithm="CRC64NVME")
assert upload["ChecksumType"] == "FULL_OBJECT", upload
parts = []
for number, data in [(1, first), (2, second)]:
    part = s3.upload_part(Bucket=bucket, Key="crc", UploadId=upload["UploadId"], PartNumber=number, Body=data)
    assert part["ChecksumCRC64NVME"] == crc64nvme(data), part
    parts.append({"PartNumber": number, "ETag": part["ETag"]})
done = s3.complete_multipart_upload(Bucket=bucket, Key="crc", UploadId=upload["UploadId"], MultipartUpload={"Parts": parts})
assert (done["ChecksumCRC64NVME"], done["ChecksumType"]) == (crc64nvme(first + second), "FULL_OBJECT"), done
expect_error(
    "InvalidRequest", 400, s3.create_multipart_upload, Bucket=bucket, Key="crc", ChecksumAlgorithm="SHA256",
    ChecksumType="FULL_OBJECT",
)

# Presigned GET and PUT (content-type signed), and tampering.
url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "docs/readme.txt"}, ExpiresIn=300)
assert urllib.request.urlopen(url).read() == body
tampered = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")[:-1]
try:
    urllib.request.urlopen(tampered)
    raise AssertionError("a tampered signature was accepted")
except urllib.error.HTTPError as e:
    assert e.code == 403, e.code
put_url = s3.generate_presigned_url(
    "put_object", Params={"Bucket": bucket, "Key": "upload.png", "ContentType": "image/png"}, ExpiresIn=300
)
ok = urllib.request.Request(put_url, data=b"\x89PNG", method="PUT", headers={"Content-Type": "image/png"})
assert urllib.request.urlopen(ok).status == 200
bad = urllib.request.Request(put_url, data=b"<html>", method="PUT", headers={"Content-Type": "text/html"})
try:
    urllib.request.urlopen(bad)
    raise AssertionError("a presigned PUT with another content-type was accepted")
except urllib.error.HTTPError as e:
    assert e.code == 403, e.code
assert s3.get_object(Bucket=bucket, Key="upload.png")["Body"].read() == b"\x89PNG"

# Virtual-hosted addressing: <bucket>.s3.localhost (the server runs with --s3-domain s3.localhost).
import http.client
import urllib.parse

virtual = boto3.client(
    "s3",
    endpoint_url=ENDPOINT.replace("127.0.0.1", "s3.localhost"),
    region_name="auto",
    config=Config(signature_version="s3v4", s3={"addressing_style": "virtual"}),
)
url = urllib.parse.urlsplit(
    virtual.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "docs/readme.txt"}, ExpiresIn=300)
)
assert url.hostname == f"{bucket}.s3.localhost", url
connection = http.client.HTTPConnection("127.0.0.1", url.port)
connection.request("GET", f"{url.path}?{url.query}", headers={"Host": url.netloc})
answer = connection.getresponse()
assert (answer.status, answer.read()) == (200, body)

# Batch delete lists every key, missing ones too; a non-empty bucket is not deleted.
out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "copy-same"}, {"Key": "never-was"}]})
assert sorted(d["Key"] for d in out["Deleted"]) == ["copy-same", "never-was"]
expect_error("NoSuchKey", 404, s3.get_object, Bucket=bucket, Key="copy-same")
expect_error("BucketNotEmpty", 409, s3.delete_bucket, Bucket=bucket)
while True:
    page = s3.list_objects_v2(Bucket=bucket)
    keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
    if not keys:
        break
    s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
s3.delete_bucket(Bucket=bucket)
expect_error("NoSuchBucket", 404, s3.list_objects_v2, Bucket=bucket)
print(f"boto3 suite ({MODE}) passed")
