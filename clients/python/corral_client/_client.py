"""The clients: Client (blocking) and AsyncClient (asyncio), over urllib."""

from __future__ import annotations

import asyncio
import contextlib
import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

from .errors import CorralError
from .types import (
    Event,
    ExecChunk,
    ExecResult,
    ExecStarted,
    Health,
    Project,
    Session,
    SessionCreated,
    SpawnResponse,
    Task,
    TaskPage,
    TaskResult,
    Tool,
    UploadResponse,
    WorkspaceEntry,
    WorkspaceFile,
    WorkspaceListing,
)

DEFAULT_URL = "http://127.0.0.1:7777"

T = TypeVar("T")


def _drop_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _quote(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class Client:
    """A blocking client of a Corral server's HTTP API.

    base_url and token default to $CORRAL_URL and $CORRAL_API_TOKEN. Every
    error answer raises CorralError with the server's status, code and
    message.
    """

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 300.0) -> None:
        self.base_url = (base_url or os.environ.get("CORRAL_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("CORRAL_API_TOKEN", "")
        self.timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    # The transport.

    def _open(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
              data: bytes | None = None, content_type: str | None = None, accept: str = "application/json"):
        url = self.base_url + path
        if query:
            q = []
            for k, v in query.items():
                if v is None:
                    continue
                for item in v if isinstance(v, (list, tuple)) else [v]:
                    q.append((k, str(item).lower() if isinstance(item, bool) else str(item)))
            if q:
                url += "?" + urllib.parse.urlencode(q)
        if body is not None:
            data = json.dumps(body).encode()
            content_type = "application/json"
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", accept)
        if content_type:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            with e:
                raise CorralError.from_answer(e.code, e.read()) from None
        except urllib.error.URLError as e:
            raise CorralError(0, "unavailable", f"no Corral server answers at {self.base_url}: {e.reason}") from None

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        with self._open(method, path, **kw) as resp:
            return json.load(resp)

    def _bytes(self, method: str, path: str, **kw: Any) -> bytes:
        with self._open(method, path, accept="*/*", **kw) as resp:
            return resp.read()

    # The API.

    def openapi(self) -> dict[str, Any]:
        """The server's OpenAPI document."""
        return cast(dict[str, Any], self._json("GET", "/api/openapi.json"))

    def health(self) -> Health:
        """The server's state, queue and doctor's findings."""
        return cast(Health, self._json("GET", "/api/health"))

    def spawn(self, task_description: str, *, agent: str | None = None, command: Sequence[str] | None = None,
              workspace: str | None = None, runtime: str | None = None, labels: Mapping[str, str] | None = None,
              idempotency_key: str | None = None, timeout_minutes: int | None = None, **fields: Any) -> SpawnResponse:
        """Queues a task; any other field of SpawnRequest goes in fields."""
        body = _drop_none({"task_description": task_description, "agent": agent,
                           "command": list(command) if command is not None else None, "workspace": workspace,
                           "runtime": runtime, "labels": dict(labels) if labels is not None else None,
                           "idempotency_key": idempotency_key, "timeout_minutes": timeout_minutes, **fields})
        return cast(SpawnResponse, self._json("POST", "/api/tasks", body=body))

    def get_task(self, task_id: str) -> Task:
        return cast(Task, self._json("GET", "/api/tasks/" + _quote(task_id)))

    def list_tasks(self, *, status: str | None = None, workspace: str | None = None, conversation_id: str | None = None,
                   limit: int | None = None, cursor: str | None = None) -> TaskPage:
        """A page of tasks, newest first; the next page's cursor is next_cursor."""
        q = {"status": status, "workspace": workspace, "conversation_id": conversation_id, "limit": limit, "cursor": cursor}
        return cast(TaskPage, self._json("GET", "/api/tasks", query=q))

    def result(self, task_id: str, *, wait: float | None = None, include_file_contents: Iterable[str] = ()) -> TaskResult:
        """A task's result, waiting up to wait seconds for its end (done says whether it ended)."""
        q = {"wait": f"{wait:g}s" if wait is not None else None, "include_file_contents": list(include_file_contents)}
        return cast(TaskResult, self._json("GET", "/api/tasks/" + _quote(task_id) + "/result", query=q))

    def cancel_task(self, task_id: str) -> Task:
        return cast(Task, self._json("POST", "/api/tasks/" + _quote(task_id) + "/cancel", body={}))

    def task_events(self, task_id: str, *, after: str | None = None) -> list[Event]:
        """A task's events so far."""
        return cast(list[Event], self._json("GET", "/api/tasks/" + _quote(task_id) + "/events", query={"after": after})["events"])

    def follow_events(self, task_id: str | None = None, *, after: str | None = None) -> Iterator[Event]:
        """Yields events as they are recorded (server-sent events): a task's,
        or every task's when task_id is None; from the event after the id
        after, or the first. It goes on until the caller stops; a stream
        cut off resumes with after set to the last event's event_id."""
        path = "/api/tasks/" + _quote(task_id) + "/events" if task_id else "/api/events"
        with self._open("GET", path, query={"after": after}, accept="text/event-stream") as resp:
            data: list[str] = []
            for raw in resp:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield cast(Event, json.loads("\n".join(data)))
                    data = []
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))

    def task_logs(self, task_id: str, *, stream: str | None = None) -> str:
        """A task's output so far (stdout and stderr, or the one stream named)."""
        return self._bytes("GET", "/api/tasks/" + _quote(task_id) + "/logs", query={"stream": stream}).decode("utf-8", "replace")

    def task_file(self, task_id: str, path: str) -> bytes:
        """An output file of a task."""
        return self._bytes("GET", "/api/tasks/" + _quote(task_id) + "/files/" + urllib.parse.quote(path))

    def execute(self, command: str, **fields: Any) -> ExecResult:
        """Runs a shell command in a fresh sandbox and answers when it ends (code_execute)."""
        return cast(ExecResult, self._json("POST", "/api/exec", body={"command": command, **fields}))

    def create_session(self, *, runtime: str | None = None, workspace: str | None = None, network: str | None = None,
                       labels: Mapping[str, str] | None = None, **fields: Any) -> SessionCreated:
        """Starts a session; its token is in the answer only."""
        body = _drop_none({"runtime": runtime, "workspace": workspace, "network": network,
                           "labels": dict(labels) if labels is not None else None, **fields})
        return cast(SessionCreated, self._json("POST", "/api/sessions", body=body))

    def get_session(self, session_id: str) -> Session:
        return cast(Session, self._json("GET", "/api/sessions/" + _quote(session_id)))

    def list_sessions(self) -> list[Session]:
        return cast(list[Session], self._json("GET", "/api/sessions")["sessions"] or [])

    def delete_session(self, session_id: str) -> Session:
        """Ends a session."""
        return cast(Session, self._json("DELETE", "/api/sessions/" + _quote(session_id)))

    def exec(self, session_id: str, command: str | Sequence[str], *, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: str | None = None,
             timeout_seconds: int | None = None) -> Iterator[ExecChunk]:
        """Runs a command in a session, yielding its stream's chunks as they
        come: "started", then "stdout"/"stderr" (text in data, or bytes in
        data_base64; chunk_bytes decodes either), "gap", "heartbeat", and
        last "exit" with exit_code. A string runs with sh -c; a sequence is
        an argv. Closing the iterator early leaves the command running."""
        body = _drop_none({"command": command if isinstance(command, str) else list(command), "cwd": cwd,
                           "env": dict(env) if env is not None else None, "stdin": stdin,
                           "timeout_seconds": timeout_seconds})
        resp = self._open("POST", "/api/sessions/" + _quote(session_id) + "/exec", body=body, accept="application/x-ndjson")
        with resp:
            for line in resp:
                if line.strip():
                    yield cast(ExecChunk, json.loads(line))

    def exec_detached(self, session_id: str, command: str | Sequence[str], **fields: Any) -> ExecStarted:
        """Starts a command in a session and answers its exec id at once."""
        body = {"command": command if isinstance(command, str) else list(command), "detach": True, **fields}
        return cast(ExecStarted, self._json("POST", "/api/sessions/" + _quote(session_id) + "/exec", body=body))

    def tools(self) -> list[Tool]:
        """The tools, as OpenAI-style function definitions."""
        return cast(list[Tool], self._json("GET", "/api/tools"))

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        return self._json("POST", "/api/tools/" + _quote(name), body=dict(arguments or {}))

    def upload(self, files: Mapping[str, bytes]) -> UploadResponse:
        """Uploads files (by name) as attachments, all or none."""
        boundary = uuid.uuid4().hex
        parts = []
        for name, content in files.items():
            quoted = name.replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{quoted}"\r\n'
                         f"Content-Type: application/octet-stream\r\n\r\n".encode() + content + b"\r\n")
        data = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return cast(UploadResponse, self._json("POST", "/api/attachments", data=data,
                                               content_type="multipart/form-data; boundary=" + boundary))

    def download_attachment(self, attachment_id: str) -> bytes:
        return self._bytes("GET", "/api/attachments/" + _quote(attachment_id))

    def list_workspaces(self) -> list[Project]:
        return cast(list[Project], self._json("GET", "/api/workspaces")["workspaces"] or [])

    def create_workspace(self, name: str, *, init_git: bool = False) -> Project:
        return cast(Project, self._json("POST", "/api/workspaces", body={"name": name, "init_git": init_git}))

    def read_shared(self, path: str = "", *, recursive: bool = False) -> WorkspaceListing | WorkspaceFile:
        """A directory's entries, or a file (its content cut at the server's read limit), of the shared workspace."""
        return cast(WorkspaceListing | WorkspaceFile,
                    self._json("GET", "/api/workspace/" + urllib.parse.quote(path), query={"recursive": recursive or None}))

    def write_shared(self, path: str, content: bytes) -> WorkspaceEntry:
        """Writes a file of the shared workspace."""
        return cast(WorkspaceEntry, self._json("PUT", "/api/workspace/" + urllib.parse.quote(path), data=content,
                                               content_type="application/octet-stream"))


def chunk_bytes(chunk: ExecChunk) -> bytes:
    """The output bytes of a stdout or stderr chunk."""
    if "data_base64" in chunk:
        return base64.b64decode(chunk["data_base64"])
    return chunk.get("data", "").encode()


async def _in_thread(it: Iterator[T]) -> AsyncIterator[T]:
    """The items of a blocking iterator, each read in a worker thread."""
    done = object()
    try:
        while True:
            item = await asyncio.to_thread(next, it, done)
            if item is done:
                return
            yield cast(T, item)
    finally:
        # A generator a worker thread still runs cannot be closed: it ends
        # with its stream.
        if isinstance(it, Generator):
            with contextlib.suppress(ValueError):
                it.close()


class AsyncClient:
    """An asyncio client of a Corral server's HTTP API: Client's methods as
    coroutines (each request runs in a worker thread), and exec as an async
    iterator."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 300.0) -> None:
        self._c = Client(base_url, token, timeout=timeout)

    @property
    def base_url(self) -> str:
        return self._c.base_url

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def openapi(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._c.openapi)

    async def health(self) -> Health:
        return await asyncio.to_thread(self._c.health)

    async def spawn(self, task_description: str, *, agent: str | None = None, command: Sequence[str] | None = None,
                    workspace: str | None = None, runtime: str | None = None, labels: Mapping[str, str] | None = None,
                    idempotency_key: str | None = None, timeout_minutes: int | None = None, **fields: Any) -> SpawnResponse:
        """Queues a task; any other field of SpawnRequest goes in fields."""
        return await asyncio.to_thread(lambda: self._c.spawn(
            task_description, agent=agent, command=command, workspace=workspace, runtime=runtime, labels=labels,
            idempotency_key=idempotency_key, timeout_minutes=timeout_minutes, **fields))

    async def get_task(self, task_id: str) -> Task:
        return await asyncio.to_thread(self._c.get_task, task_id)

    async def list_tasks(self, *, status: str | None = None, workspace: str | None = None,
                         conversation_id: str | None = None, limit: int | None = None,
                         cursor: str | None = None) -> TaskPage:
        """A page of tasks, newest first; the next page's cursor is next_cursor."""
        return await asyncio.to_thread(lambda: self._c.list_tasks(
            status=status, workspace=workspace, conversation_id=conversation_id, limit=limit, cursor=cursor))

    async def result(self, task_id: str, *, wait: float | None = None, include_file_contents: Iterable[str] = ()) -> TaskResult:
        return await asyncio.to_thread(lambda: self._c.result(task_id, wait=wait, include_file_contents=include_file_contents))

    async def cancel_task(self, task_id: str) -> Task:
        return await asyncio.to_thread(self._c.cancel_task, task_id)

    async def task_events(self, task_id: str, *, after: str | None = None) -> list[Event]:
        return await asyncio.to_thread(lambda: self._c.task_events(task_id, after=after))

    async def task_logs(self, task_id: str, *, stream: str | None = None) -> str:
        return await asyncio.to_thread(lambda: self._c.task_logs(task_id, stream=stream))

    async def task_file(self, task_id: str, path: str) -> bytes:
        return await asyncio.to_thread(self._c.task_file, task_id, path)

    async def execute(self, command: str, **fields: Any) -> ExecResult:
        return await asyncio.to_thread(lambda: self._c.execute(command, **fields))

    async def create_session(self, *, runtime: str | None = None, workspace: str | None = None,
                             network: str | None = None, labels: Mapping[str, str] | None = None,
                             **fields: Any) -> SessionCreated:
        """Starts a session; its token is in the answer only."""
        return await asyncio.to_thread(lambda: self._c.create_session(
            runtime=runtime, workspace=workspace, network=network, labels=labels, **fields))

    async def get_session(self, session_id: str) -> Session:
        return await asyncio.to_thread(self._c.get_session, session_id)

    async def list_sessions(self) -> list[Session]:
        return await asyncio.to_thread(self._c.list_sessions)

    async def delete_session(self, session_id: str) -> Session:
        return await asyncio.to_thread(self._c.delete_session, session_id)

    async def exec(self, session_id: str, command: str | Sequence[str], *, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, stdin: str | None = None,
                   timeout_seconds: int | None = None) -> AsyncIterator[ExecChunk]:
        """Runs a command in a session, yielding its stream's chunks as they
        come; see Client.exec."""
        async for chunk in _in_thread(self._c.exec(session_id, command, cwd=cwd, env=env, stdin=stdin,
                                                   timeout_seconds=timeout_seconds)):
            yield chunk

    async def follow_events(self, task_id: str | None = None, *, after: str | None = None) -> AsyncIterator[Event]:
        """Yields events as they are recorded; see Client.follow_events."""
        async for e in _in_thread(self._c.follow_events(task_id, after=after)):
            yield e

    async def exec_detached(self, session_id: str, command: str | Sequence[str], **fields: Any) -> ExecStarted:
        return await asyncio.to_thread(lambda: self._c.exec_detached(session_id, command, **fields))

    async def tools(self) -> list[Tool]:
        return await asyncio.to_thread(self._c.tools)

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        return await asyncio.to_thread(self._c.call_tool, name, arguments)

    async def upload(self, files: Mapping[str, bytes]) -> UploadResponse:
        return await asyncio.to_thread(self._c.upload, files)

    async def download_attachment(self, attachment_id: str) -> bytes:
        return await asyncio.to_thread(self._c.download_attachment, attachment_id)

    async def list_workspaces(self) -> list[Project]:
        return await asyncio.to_thread(self._c.list_workspaces)

    async def create_workspace(self, name: str, *, init_git: bool = False) -> Project:
        return await asyncio.to_thread(lambda: self._c.create_workspace(name, init_git=init_git))

    async def read_shared(self, path: str = "", *, recursive: bool = False) -> WorkspaceListing | WorkspaceFile:
        return await asyncio.to_thread(lambda: self._c.read_shared(path, recursive=recursive))

    async def write_shared(self, path: str, content: bytes) -> WorkspaceEntry:
        return await asyncio.to_thread(self._c.write_shared, path, content)

