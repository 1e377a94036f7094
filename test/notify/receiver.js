// A host's notification endpoint for internal/app/notify_test.go: it
// verifies every POST with the official Standard Webhooks library and
// appends one JSON line per request to OUT:
//   {"webhook_id", "received_at_ms", "verified", "error", "payload"}
// It answers 204 to a verified notification and 401 otherwise.
//
// Environment: PORT (0 picks one), SECRET (whsec_...), OUT (a file).
// It prints "listening PORT" once it accepts connections.
"use strict";

const fs = require("node:fs");
const http = require("node:http");
const { Webhook } = require("standardwebhooks");

const wh = new Webhook(process.env.SECRET);
const out = process.env.OUT;

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const receivedAt = Date.now();
    const body = Buffer.concat(chunks).toString("utf8");
    const line = { webhook_id: req.headers["webhook-id"] || "", received_at_ms: receivedAt, verified: false };
    try {
      line.payload = wh.verify(body, req.headers);
      line.verified = true;
    } catch (err) {
      line.error = String(err && err.message ? err.message : err);
    }
    // Record before answering: once Corral sees the 2xx, the line is on disk.
    fs.appendFileSync(out, JSON.stringify(line) + "\n");
    res.writeHead(line.verified ? 204 : 401);
    res.end();
  });
});

server.listen(Number(process.env.PORT || 0), "127.0.0.1", () => {
  process.stdout.write(`listening ${server.address().port}\n`);
});
