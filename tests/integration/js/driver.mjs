// Drives docs/protocol.md's JavaScript client (temper-client.mjs, copied beside this file by
// the test) against a real stack, and decodes every golden fixture with the same code.
//   node driver.mjs <nats url> <fixtures dir>
// Prints one JSON object on stdout; any failure exits non-zero with the reason on stderr.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { deepStrictEqual, strictEqual } from "node:assert/strict";
import { connect } from "nats";
import {
  completionOf, decodeMessage, listDomains, packF32, packI32, submitTask, taskFor,
  unpackF32, unpackI32, waitScored,
} from "./temper-client.mjs";

// §12.1: bins as base64 text, and the JSON Pointer of every bin.
function jsonForm(value, path, bins) {
  if (value instanceof Uint8Array) {
    bins.push(path);
    return Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("base64");
  }
  if (Array.isArray(value)) return value.map((item, i) => jsonForm(item, `${path}/${i}`, bins));
  if (value !== null && typeof value === "object") {
    const escaped = (key) => key.replaceAll("~", "~0").replaceAll("/", "~1");
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [k, jsonForm(v, `${path}/${escaped(k)}`, bins)]),
    );
  }
  return value;
}

function at(value, pointer) {
  for (const part of pointer.split("/").slice(1)) {
    value = value[part.replaceAll("~1", "/").replaceAll("~0", "~")];
  }
  return value;
}

const UNPACK = { int32: unpackI32, float32: unpackF32, uint8: (bin) => Array.from(bin) };

function checkFixture(dir, name) {
  const doc = JSON.parse(readFileSync(join(dir, name), "utf8"));
  // Copy into a buffer at an odd offset: the unpackers must not depend on alignment.
  const raw = readFileSync(join(dir, doc.msgpack));
  const shifted = new Uint8Array(raw.length + 1).subarray(1);
  shifted.set(raw);
  const message = decodeMessage(shifted);
  strictEqual(message.type, doc.type);
  const bins = [];
  deepStrictEqual(jsonForm(message, "", bins), doc.value);
  deepStrictEqual(bins, doc.bin);
  for (const [pointer, layout] of Object.entries(doc.packed)) {
    deepStrictEqual(UNPACK[layout.element](at(message, pointer)), layout.values, pointer);
  }
  return Object.keys(doc.packed).length;
}

function checkPacking() {
  const ids = [1, 151644, -1];
  deepStrictEqual(Array.from(packI32(ids)), [1, 0, 0, 0, 0x5c, 0x50, 2, 0, 255, 255, 255, 255]);
  deepStrictEqual(unpackI32(packI32(ids)), ids);
  deepStrictEqual(Array.from(packF32([-0.5, -1.0])), [0, 0, 0, 0xbf, 0, 0, 0x80, 0xbf]);
  deepStrictEqual(unpackF32(packF32([-0.5, -1.0])), [-0.5, -1.0]);
}

async function roundTrip(nc, taskId) {
  const js = nc.jetstream();
  const [arithmetic] = await listDomains(nc, ["arithmetic"], { examples: true });
  const metadata = { answer: "5" };
  const task = taskFor(arithmetic, taskId, "2+3", metadata, { n: 2 });
  const first = await submitTask(js, task);
  const again = await submitTask(js, task, { trace: first.trace });
  const scored = await waitScored(js, taskId, task.n, { timeoutMs: 90000 });
  const results = scored.map((s) => {
    const { prompt, completion, logprobs, mask } = completionOf(s);
    strictEqual(logprobs.length, completion.length);
    strictEqual(mask.length, completion.length);
    return {
      id: s.id, status: s.status, reward: s.reward, sample_index: s.rollout.sample_index,
      prompt_len: prompt.length, completion: completion.length, logprobs,
    };
  });
  return { domain: arithmetic, first, again, results };
}

const [url, fixtures] = process.argv.slice(2);
checkPacking();
const names = readdirSync(fixtures).filter((n) => n.endsWith(".json")).sort();
const packed = names.reduce((sum, name) => sum + checkFixture(fixtures, name), 0);
const nc = await connect({ servers: url });
try {
  const run = await roundTrip(nc, `js-${Date.now()}`);
  console.log(JSON.stringify({ fixtures: names.length, packed, ...run }));
} finally {
  await nc.close();
}
