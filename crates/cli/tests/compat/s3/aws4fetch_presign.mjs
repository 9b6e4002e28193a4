// The browser-upload flow R2's docs and the seed use: a Worker signs a PUT URL with aws4fetch
// (query signing, the Content-Type signed, X-Amz-Expires=300), and the browser PUTs the file to
// it. Checks that the URL works with the signed Content-Type and is refused (403) with another.
//
// Env: KURA_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, BUCKET.
import { AwsClient } from "aws4fetch";

const endpoint = process.env.KURA_S3_ENDPOINT;
const bucket = process.env.BUCKET;
const r2 = new AwsClient({
  accessKeyId: process.env.AWS_ACCESS_KEY_ID,
  secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY,
  // R2's own host names tell aws4fetch this; a local endpoint has to say it.
  service: "s3",
  region: "auto",
});

async function presignPut(key, contentType) {
  const url = new URL(`${endpoint}/${bucket}/${key}`);
  url.searchParams.set("X-Amz-Expires", "300");
  // allHeaders: aws4fetch leaves Content-Type unsigned unless told to sign every header.
  const signed = await r2.sign(
    new Request(url, { method: "PUT", headers: { "Content-Type": contentType } }),
    { aws: { signQuery: true, allHeaders: true } },
  );
  return signed.url;
}

function check(condition, message) {
  if (!condition) {
    console.error(`FAILED: ${message}`);
    process.exit(1);
  }
}

const png = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 1, 2, 3]);
const url = await presignPut("uploads/avatar.png", "image/png");
check(url.includes("X-Amz-Expires=300") && url.includes("X-Amz-SignedHeaders=content-type%3Bhost"), `a presigned URL signing the content-type: ${url}`);

const ok = await fetch(url, { method: "PUT", headers: { "Content-Type": "image/png" }, body: png });
check(ok.status === 200, `PUT with the signed content-type: ${ok.status} ${await ok.text()}`);

const wrongUrl = await presignPut("uploads/other.png", "image/png");
const wrong = await fetch(wrongUrl, { method: "PUT", headers: { "Content-Type": "text/html" }, body: "<script>" });
const wrongBody = await wrong.text();
check(wrong.status === 403, `PUT with another content-type: ${wrong.status} ${wrongBody}`);
check(wrongBody.includes("<Code>SignatureDoesNotMatch</Code>"), `an S3 error body: ${wrongBody}`);

// What was stored is exactly what the browser sent; the refused upload stored nothing.
const getUrl = await r2.sign(new Request(`${endpoint}/${bucket}/uploads/avatar.png`), { aws: { signQuery: true } });
const back = await fetch(getUrl.url);
check(back.status === 200, `GET the upload: ${back.status}`);
check(back.headers.get("content-type") === "image/png", `stored content-type: ${back.headers.get("content-type")}`);
const bytes = new Uint8Array(await back.arrayBuffer());
check(bytes.length === png.length && bytes.every((b, i) => b === png[i]), "the bytes round-trip");
const missing = await fetch((await r2.sign(new Request(`${endpoint}/${bucket}/uploads/other.png`), { aws: { signQuery: true } })).url);
check(missing.status === 404, `the refused upload stored nothing: ${missing.status}`);
console.log("aws4fetch presigned upload flow passed");
