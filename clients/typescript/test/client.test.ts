// The client against a real Corral server: $CORRAL_URL, $CORRAL_API_TOKEN
// (internal/e2e's TestClients starts one with the local runtime and runs
// these).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, it } from "node:test";

import { chunkBytes, CorralClient, CorralError, type ExecChunk } from "../src/index.js";

const skip = process.env.CORRAL_URL ? false : "CORRAL_URL is not set: these tests need a running Corral server";
const text = (chunks: ExecChunk[], type: string) =>
  Buffer.concat(chunks.filter((c) => c.type === type).map((c) => chunkBytes(c))).toString();

async function rejects(p: Promise<unknown>): Promise<CorralError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof CorralError, `${e} is not a CorralError`);
    return e;
  }
  assert.fail("no error");
}

describe("CorralClient", { skip }, () => {
  const corral = new CorralClient();

  it("reads health, the document and the tools", async () => {
    assert.equal((await corral.health()).ready, true);
    assert.equal((await corral.openapi()).openapi, "3.1.0");
    assert.ok((await corral.tools()).some((t) => t.function.name === "spawn_worker"));
  });

  it("runs a task from spawn to result", async () => {
    const spawned = await corral.spawn({
      task_description: "write a greeting",
      command: ["sh", "-c", "echo hello > output/hello.txt; echo done"],
      labels: { client: "typescript" },
    });
    assert.equal(spawned.status, "queued");
    const id = spawned.task_id;
    const res = await corral.result(id, { waitSeconds: 60, includeFileContents: ["hello.txt"] });
    assert.equal(res.done, true);
    assert.equal(res.status, "success");
    assert.equal(res.file_contents?.["hello.txt"]?.content, "hello\n");
    assert.equal(Buffer.from(await corral.taskFile(id, "hello.txt")).toString(), "hello\n");
    assert.deepEqual((await corral.getTask(id)).labels, { client: "typescript" });
    assert.ok((await corral.listTasks({ limit: 100 })).tasks?.some((t) => t.task_id === id));
    assert.equal((await corral.taskEvents(id))[0]?.type, "task_created");
    assert.match(await corral.taskLogs(id), /done/);
  });

  it("follows a task's events", async () => {
    const { task_id: id } = await corral.spawn({ task_description: "wait a little", command: ["sleep", "1"] });
    const seen: string[] = [];
    for await (const e of corral.followEvents(id)) {
      seen.push(e.type);
      if (e.type === "worker_completed") break;
    }
    assert.equal(seen[0], "task_created");
    assert.ok(seen.includes("task_started"), seen.join(" "));
    // Resumed after the first, it starts with the second.
    const first = (await corral.taskEvents(id))[0]!.event_id;
    for await (const e of corral.followEvents(id, { after: first })) {
      assert.equal(e.type, seen[1]);
      break;
    }
  });

  it("throws the API's error as CorralError", async () => {
    let e = await rejects(corral.getTask("task-00000000000000000000000000"));
    assert.deepEqual([e.status, e.code], [404, "not_found"]);
    assert.match(e.requestId, /^req_/);
    // The command agent: the default one (claude) has no credentials on the
    // test's server, a failed precondition (422) beside the blank description.
    e = await rejects(corral.spawn({ task_description: "", agent: "command" }));
    assert.deepEqual([e.status, e.code], [400, "invalid_argument"]);
    assert.ok(e.fields.some((f) => f.field === "task_description"));
    e = await rejects(new CorralClient({ token: "not-the-token" }).getTask("task-00000000000000000000000000"));
    assert.deepEqual([e.status, e.code], [401, "unauthenticated"]);
    e = await rejects(new CorralClient({ baseUrl: "http://127.0.0.1:1" }).health());
    assert.equal(e.status, 0);
  });

  it("streams a session's exec", async () => {
    const created = await corral.createSession({ labels: { client: "typescript" } });
    const id = created.session_id;
    try {
      assert.equal(created.session.status, "running");
      assert.ok((await corral.listSessions()).some((s) => s.session_id === id));
      // Streamed: the first line comes as it is printed, long before the
      // command's end two seconds later.
      const chunks: ExecChunk[] = [];
      const at: number[] = [];
      for await (const c of corral.exec(id, "echo one; sleep 2; echo two >&2; exit 3")) {
        chunks.push(c);
        at.push(performance.now());
      }
      const first = chunks.findIndex((c) => c.type === "stdout");
      assert.ok(at.at(-1)! - at[first]! > 1000, "the output came all at the end: not streamed");
      assert.equal(chunks[0]?.type, "started");
      assert.equal(chunks.at(-1)?.type, "exit");
      assert.equal(chunks.at(-1)?.exit_code, 3);
      assert.deepEqual([text(chunks, "stdout"), text(chunks, "stderr")], ["one\n", "two\n"]);
      const fed: ExecChunk[] = [];
      for await (const c of corral.exec(id, ["cat"], { stdin: "fed\n" })) fed.push(c);
      assert.equal(text(fed, "stdout"), "fed\n");
      assert.equal((await corral.getSession(id)).execs, 2);
    } finally {
      assert.equal((await corral.deleteSession(id)).status, "ended");
    }
  });

  it("uploads attachments and reads and writes workspaces", async () => {
    const up = await corral.upload({ "notes.txt": "some notes\n" });
    assert.equal(up.name, "notes.txt");
    assert.equal(Buffer.from(await corral.downloadAttachment(up.attachment_id)).toString(), "some notes\n");
    await corral.writeShared("ts/a.txt", "a note\n");
    const f = await corral.readShared("ts/a.txt");
    assert.ok("content" in f);
    assert.equal(f.content, "a note\n");
    const listing = await corral.readShared("ts");
    assert.ok("entries" in listing);
    assert.deepEqual(listing.entries?.map((e) => e.path), ["ts/a.txt"]);
    const name = `ts-${randomUUID().slice(0, 8)}`;
    assert.equal((await corral.createWorkspace(name)).name, name);
    assert.ok((await corral.listWorkspaces()).some((w) => w.name === name));
  });
});
