// Example tapflow NATS subscriber in JavaScript, with no tapflow code:
// the `nats` client, `apache-arrow` and pure-JS zstd / LZ4 decoders,
// following docs/subscribers.md. Sums bytes by tenant × zone from live
// flow.v1 batches and prints the table after --records records (or on
// Ctrl-C).
//
//   npm ci
//   node subscriber.mjs --server nats://127.0.0.1:4222 --records 100000
//   node subscriber.mjs --server nats://127.0.0.1:4222 --durable analytics
import { parseArgs } from "node:util";
import { connect, credsAuthenticator, AckPolicy, DeliverPolicy, nanos } from "nats";
import { tableFromIPC, compressionRegistry, CompressionType } from "apache-arrow";
import { decompress as zstdDecompress } from "fzstd";
import lz4 from "lz4js";

const { values: args } = parseArgs({
  options: {
    server: { type: "string", default: "nats://127.0.0.1:4222" },
    creds: { type: "string" },
    durable: { type: "string" }, // empty: ordered ephemeral consumer
    records: { type: "string", default: "0" },
  },
});
const want = BigInt(args.records);

// Arrow IPC buffer compression (Tapflow-Codec arrow-zstd, lz4): apache-arrow
// reads it once a codec is registered.
// Decoded buffers must start 8-byte aligned (BigInt64Array views):
// fzstd may return a view into a larger buffer, so copy those.
const aligned = (b) => (b.byteOffset % 8 === 0 ? b : b.slice());
compressionRegistry.set(CompressionType.ZSTD, { decode: (b) => aligned(zstdDecompress(b)) });
compressionRegistry.set(CompressionType.LZ4_FRAME, { decode: (b) => aligned(lz4.decompress(b)) });

const opts = { servers: args.server };
if (args.creds) {
  const { readFileSync } = await import("node:fs");
  opts.authenticator = credsAuthenticator(readFileSync(args.creds));
}
const nc = await connect(opts);
const js = nc.jetstream();
const STREAM = "TAPFLOW_FLOWS";
const FILTER = "tapflow.flows.v1.>";

let consumer;
if (args.durable) {
  // A durable next to the collector's: the stream keeps each message until
  // this consumer acks it too; the server deletes the consumer after an
  // hour without a pull, so a subscriber gone for good stops pinning data.
  const jsm = await nc.jetstreamManager();
  await jsm.consumers.add(STREAM, {
    durable_name: args.durable,
    filter_subject: FILTER,
    deliver_policy: DeliverPolicy.New,
    ack_policy: AckPolicy.Explicit,
    ack_wait: nanos(60_000),
    max_ack_pending: 1000,
    inactive_threshold: nanos(3_600_000),
  });
  consumer = await js.consumers.get(STREAM, args.durable);
} else {
  // Ordered consumer: ephemeral, no acks; never takes the collector's
  // messages. It holds the ones not sent to it yet, so the server drops it
  // 10 s (milliseconds here) after this process stops pulling.
  consumer = await js.consumers.get(STREAM, { filterSubjects: [FILTER], deliver_policy: DeliverPolicy.New, inactive_threshold: 10_000 });
}
const messages = await consumer.consume();
process.on("SIGINT", () => messages.stop());
console.error("subscribed to " + STREAM);

const totals = new Map(); // "tenant\tzone" -> BigInt bytes
let seen = 0n;

function body(msg) {
  const codec = msg.headers?.get("Tapflow-Codec");
  switch (codec) {
    case "zstd": // the Arrow IPC stream in one zstd frame
      return zstdDecompress(msg.data);
    case "arrow-zstd":
    case "lz4":
    case "none": // Arrow IPC; buffers decompressed by apache-arrow
      return msg.data;
    default:
      throw new Error(`codec ${codec} unknown to this subscriber`);
  }
}

for await (const msg of messages) {
  try {
    const schema = msg.headers?.get("Tapflow-Schema");
    if (schema !== "flow.v1") throw new Error(`schema ${schema}, want flow.v1`);
    const table = tableFromIPC(body(msg));
    // Columns by name: new columns are appended in minor versions.
    const tenant = table.getChild("tenant_id"), zone = table.getChild("zone"), bytes = table.getChild("bytes");
    if (!tenant || !zone || !bytes) throw new Error("tenant_id, zone or bytes missing");
    for (let i = 0; i < table.numRows; i++) {
      const key = tenant.get(i) + "\t" + zone.get(i);
      totals.set(key, (totals.get(key) ?? 0n) + BigInt(bytes.get(i)));
    }
    seen += BigInt(table.numRows);
  } catch (err) {
    console.error(`skipping ${msg.headers?.get("Nats-Msg-Id")}: ${err.message}`);
  }
  if (args.durable) msg.ack();
  if (want > 0n && seen >= want) break;
}

console.log(["tenant_id".padEnd(40), "zone".padEnd(14), "bytes".padStart(14)].join(" "));
for (const key of [...totals.keys()].sort()) {
  const [t, z] = key.split("\t");
  console.log([t.padEnd(40), z.padEnd(14), totals.get(key).toString().padStart(14)].join(" "));
}
await nc.drain();
