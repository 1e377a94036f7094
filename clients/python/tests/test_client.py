"""The client against a real Corral server: $CORRAL_URL, $CORRAL_API_TOKEN
(internal/e2e's TestClients starts one with the local runtime and runs
these)."""

import os
import time
import unittest
import uuid

from corral_client import AsyncClient, Client, CorralError, chunk_bytes


def setUpModule():
    if not os.environ.get("CORRAL_URL"):
        raise unittest.SkipTest("CORRAL_URL is not set: these tests need a running Corral server")


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.corral = AsyncClient()

    async def test_health_and_document(self):
        h = await self.corral.health()
        self.assertTrue(h["ready"])
        doc = await self.corral.openapi()
        self.assertEqual(doc["openapi"], "3.1.0")
        tools = await self.corral.tools()
        self.assertIn("spawn_worker", [t["function"]["name"] for t in tools])

    async def test_task_from_spawn_to_result(self):
        spawned = await self.corral.spawn("write a greeting", command=["sh", "-c", "echo hello > output/hello.txt; echo done"],
                                          labels={"client": "python"})
        self.assertEqual(spawned["status"], "queued")
        tid = spawned["task_id"]
        res = await self.corral.result(tid, wait=60, include_file_contents=["hello.txt"])
        self.assertTrue(res["done"], res)
        self.assertEqual(res["status"], "success", res)
        self.assertEqual(res["file_contents"]["hello.txt"]["content"], "hello\n")
        self.assertEqual(await self.corral.task_file(tid, "hello.txt"), b"hello\n")
        task = await self.corral.get_task(tid)
        self.assertEqual(task["labels"], {"client": "python"})
        page = await self.corral.list_tasks(limit=100)
        self.assertIn(tid, [t["task_id"] for t in page["tasks"]])
        types = [e["type"] for e in await self.corral.task_events(tid)]
        self.assertEqual(types[0], "task_created")
        self.assertIn("done", await self.corral.task_logs(tid))

    async def test_follow_events(self):
        spawned = await self.corral.spawn("wait a little", command=["sleep", "1"])
        seen = []
        async for e in self.corral.follow_events(spawned["task_id"]):
            seen.append(e["type"])
            if e["type"] == "worker_completed":
                break
        self.assertEqual(seen[0], "task_created")
        self.assertIn("task_started", seen)
        # Resumed after the first, it starts with the second.
        it = self.corral.follow_events(spawned["task_id"], after=(await self.corral.task_events(spawned["task_id"]))[0]["event_id"])
        self.assertEqual((await anext(it))["type"], seen[1])
        await it.aclose()

    async def test_errors_carry_the_api_error(self):
        with self.assertRaises(CorralError) as cm:
            await self.corral.get_task("task-00000000000000000000000000")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        self.assertTrue(cm.exception.request_id.startswith("req_"))
        with self.assertRaises(CorralError) as cm:
            # The command agent: the default one (claude) has no credentials
            # on the test's server, a failed precondition (422) beside the
            # blank description.
            await self.corral.spawn("", agent="command")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_argument"))
        self.assertIn("task_description", [f["field"] for f in cm.exception.fields])
        with self.assertRaises(CorralError) as cm:
            await AsyncClient(token="not-the-token").get_task("task-00000000000000000000000000")
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthenticated"))

    async def test_session_exec_streams(self):
        created = await self.corral.create_session(labels={"client": "python"})
        sid = created["session_id"]
        try:
            self.assertEqual(created["session"]["status"], "running")
            self.assertIn(sid, [s["session_id"] for s in await self.corral.list_sessions()])
            # Streamed: the first line comes as it is printed, long before
            # the command's end two seconds later.
            chunks, at = [], []
            async for c in self.corral.exec(sid, "echo one; sleep 2; echo two >&2; exit 3"):
                chunks.append(c)
                at.append(time.monotonic())
            first = next(i for i, c in enumerate(chunks) if c["type"] == "stdout")
            self.assertGreater(at[-1] - at[first], 1.0, "the output came all at the end: not streamed")
            self.assertEqual(chunks[0]["type"], "started")
            self.assertEqual(chunks[-1]["type"], "exit")
            self.assertEqual(chunks[-1]["exit_code"], 3)
            out = b"".join(chunk_bytes(c) for c in chunks if c["type"] == "stdout")
            err = b"".join(chunk_bytes(c) for c in chunks if c["type"] == "stderr")
            self.assertEqual((out, err), (b"one\n", b"two\n"))
            # An argv, with stdin.
            chunks = [c async for c in self.corral.exec(sid, ["cat"], stdin="fed\n")]
            self.assertEqual(b"".join(chunk_bytes(c) for c in chunks if c["type"] == "stdout"), b"fed\n")
            self.assertEqual((await self.corral.get_session(sid))["execs"], 2)
        finally:
            ended = await self.corral.delete_session(sid)
        self.assertEqual(ended["status"], "ended")

    async def test_attachments_and_workspaces(self):
        up = await self.corral.upload({"notes.txt": b"some notes\n"})
        self.assertEqual(up["name"], "notes.txt")
        self.assertEqual(await self.corral.download_attachment(up["attachment_id"]), b"some notes\n")
        await self.corral.write_shared("py/a.txt", b"a note\n")
        f = await self.corral.read_shared("py/a.txt")
        self.assertEqual(f["content"], "a note\n")
        listing = await self.corral.read_shared("py")
        self.assertEqual([e["path"] for e in listing["entries"]], ["py/a.txt"])
        name = "py-" + uuid.uuid4().hex[:8]
        p = await self.corral.create_workspace(name)
        self.assertEqual(p["name"], name)
        self.assertIn(name, [w["name"] for w in await self.corral.list_workspaces()])


class ClientTest(unittest.TestCase):
    def test_blocking_client(self):
        with Client() as corral:
            self.assertTrue(corral.health()["ready"])
            sid = corral.create_session()["session_id"]
            try:
                chunks = list(corral.exec(sid, "echo hi"))
                self.assertEqual(chunks[-1]["exit_code"], 0)
                self.assertEqual(b"".join(chunk_bytes(c) for c in chunks if c["type"] == "stdout"), b"hi\n")
            finally:
                corral.delete_session(sid)
        with self.assertRaises(CorralError) as cm:
            Client("http://127.0.0.1:1").health()
        self.assertEqual(cm.exception.status, 0)


if __name__ == "__main__":
    unittest.main()
