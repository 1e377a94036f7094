// A client of Corral's HTTP API over fetch (its OpenAPI document is GET
// /api/openapi.json; the types in types.ts are generated from it).

import type {
  CreateSessionRequest,
  Event,
  ExecChunk,
  ExecResult,
  ExecStarted,
  FieldError,
  Health,
  Project,
  Session,
  SessionCreated,
  SpawnRequest,
  SpawnResponse,
  Task,
  TaskPage,
  TaskResult,
  Tool,
  UploadResponse,
  WorkspaceEntry,
  WorkspaceFile,
  WorkspaceListing,
} from "./types.js";

export type * from "./types.js";

export const DEFAULT_URL = "http://127.0.0.1:7777";

/**
 * An error answer of a Corral server: status is the HTTP status (0 when no
 * server answered), code the error's class as the server names it
 * ("not_found", "invalid_argument", "failed_precondition", ...), message
 * what a person should read, fields the request's fields at fault and
 * requestId the id the server logged the request under.
 */
export class CorralError extends Error {
  override readonly name = "CorralError";

  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly fields: FieldError[] = [],
    readonly requestId = "",
  ) {
    super(message);
  }

  /** The error of an answer: the API's error body, or the body as text. */
  static async fromResponse(resp: Response): Promise<CorralError> {
    const text = await resp.text();
    try {
      const eb = JSON.parse(text);
      if (eb && typeof eb.error === "string") {
        return new CorralError(resp.status, eb.code || "unknown", eb.error, eb.fields ?? [], eb.request_id ?? "");
      }
    } catch {
      // Not the API's error body: from something in front of the server.
    }
    return new CorralError(resp.status, "unknown", text.trim() || `HTTP ${resp.status}`);
  }
}

export interface ClientOptions {
  /** The server's URL; default $CORRAL_URL, then DEFAULT_URL. */
  baseUrl?: string;
  /** The API token; default $CORRAL_API_TOKEN. */
  token?: string;
  /** The fetch to use; default the global one. */
  fetch?: typeof fetch;
}

export interface ExecOptions {
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string;
  timeoutSeconds?: number;
  signal?: AbortSignal;
}

type Query = Record<string, string | number | boolean | string[] | undefined>;

const env = (name: string): string | undefined =>
  typeof process === "undefined" ? undefined : process.env[name] || undefined;

const seg = encodeURIComponent;
const pathOf = (p: string): string => p.split("/").map(encodeURIComponent).join("/");

/** The output bytes of a stdout or stderr chunk. */
export function chunkBytes(chunk: ExecChunk): Uint8Array {
  if (chunk.data_base64 !== undefined) {
    return Uint8Array.from(atob(chunk.data_base64), (c) => c.charCodeAt(0));
  }
  return new TextEncoder().encode(chunk.data ?? "");
}

/** The lines of a response's body as they come, without their line ends. */
async function* lines(resp: Response): AsyncGenerator<string, void, undefined> {
  const reader = resp.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        yield buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
      }
    }
    if (buf) yield buf;
  } finally {
    // Leaving early closes the connection.
    await reader.cancel().catch(() => {});
  }
}

/** A client of a Corral server's HTTP API. Every error answer throws CorralError. */
export class CorralClient {
  readonly baseUrl: string;
  private readonly token: string;
  private readonly fetch: typeof fetch;

  constructor(opts: ClientOptions = {}) {
    this.baseUrl = (opts.baseUrl ?? env("CORRAL_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    this.token = opts.token ?? env("CORRAL_API_TOKEN") ?? "";
    this.fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
  }

  private async request(
    method: string,
    path: string,
    init: { query?: Query; json?: unknown; body?: BodyInit; contentType?: string; accept?: string; signal?: AbortSignal } = {},
  ): Promise<Response> {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(init.query ?? {})) {
      if (v === undefined) continue;
      for (const item of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(item));
    }
    const headers: Record<string, string> = { Accept: init.accept ?? "application/json" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    let body = init.body;
    if (init.json !== undefined) {
      body = JSON.stringify(init.json);
      headers["Content-Type"] = "application/json";
    } else if (init.contentType) {
      headers["Content-Type"] = init.contentType;
    }
    let resp: Response;
    try {
      resp = await this.fetch(url, { method, headers, body, signal: init.signal });
    } catch (e) {
      if (init.signal?.aborted) throw e;
      throw new CorralError(0, "unavailable", `no Corral server answers at ${this.baseUrl}: ${(e as Error).message}`);
    }
    if (!resp.ok) throw await CorralError.fromResponse(resp);
    return resp;
  }

  private async json<T>(method: string, path: string, init: Parameters<CorralClient["request"]>[2] = {}): Promise<T> {
    return (await (await this.request(method, path, init)).json()) as T;
  }

  private async bytes(path: string, query?: Query): Promise<Uint8Array> {
    const resp = await this.request("GET", path, { query, accept: "*/*" });
    return new Uint8Array(await resp.arrayBuffer());
  }

  /** The server's OpenAPI document. */
  openapi(): Promise<Record<string, unknown>> {
    return this.json("GET", "/api/openapi.json");
  }

  /** The server's state, queue and doctor's findings. */
  health(): Promise<Health> {
    return this.json("GET", "/api/health");
  }

  /** Queues a task. */
  spawn(req: SpawnRequest): Promise<SpawnResponse> {
    return this.json("POST", "/api/tasks", { json: req });
  }

  getTask(id: string): Promise<Task> {
    return this.json("GET", `/api/tasks/${seg(id)}`);
  }

  /** A page of tasks, newest first; the next page's cursor is next_cursor. */
  listTasks(q: { status?: string; workspace?: string; conversation_id?: string; limit?: number; cursor?: string } = {}): Promise<TaskPage> {
    return this.json("GET", "/api/tasks", { query: q });
  }

  /** A task's result, waiting up to waitSeconds for its end (done says whether it ended). */
  result(id: string, opts: { waitSeconds?: number; includeFileContents?: string[] } = {}): Promise<TaskResult> {
    return this.json("GET", `/api/tasks/${seg(id)}/result`, {
      query: { wait: opts.waitSeconds === undefined ? undefined : `${opts.waitSeconds}s`, include_file_contents: opts.includeFileContents },
    });
  }

  cancelTask(id: string): Promise<Task> {
    return this.json("POST", `/api/tasks/${seg(id)}/cancel`, { json: {} });
  }

  /** A task's events so far. */
  async taskEvents(id: string, opts: { after?: string } = {}): Promise<Event[]> {
    const r = await this.json<{ events: Event[] }>("GET", `/api/tasks/${seg(id)}/events`, { query: { after: opts.after } });
    return r.events;
  }

  /**
   * Yields events as they are recorded (server-sent events): a task's, or
   * every task's when taskId is undefined; from the event after the id
   * after, or the first. It goes on until the caller leaves the loop (or
   * signal aborts); a stream cut off resumes with after set to the last
   * event's event_id.
   */
  async *followEvents(taskId?: string, opts: { after?: string; signal?: AbortSignal } = {}): AsyncGenerator<Event, void, undefined> {
    const path = taskId === undefined ? "/api/events" : `/api/tasks/${seg(taskId)}/events`;
    const resp = await this.request("GET", path, { query: { after: opts.after }, accept: "text/event-stream", signal: opts.signal });
    let data: string[] = [];
    for await (const line of lines(resp)) {
      if (line === "") {
        if (data.length > 0) yield JSON.parse(data.join("\n")) as Event;
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      }
    }
  }

  /** A task's output so far (stdout and stderr, or the one stream named). */
  async taskLogs(id: string, opts: { stream?: "stdout" | "stderr" } = {}): Promise<string> {
    return (await this.request("GET", `/api/tasks/${seg(id)}/logs`, { query: { stream: opts.stream }, accept: "text/plain" })).text();
  }

  /** An output file of a task. */
  taskFile(id: string, path: string): Promise<Uint8Array> {
    return this.bytes(`/api/tasks/${seg(id)}/files/${pathOf(path)}`);
  }

  /** Runs a shell command in a fresh sandbox and answers when it ends (code_execute). */
  execute(command: string, fields: Record<string, unknown> = {}): Promise<ExecResult> {
    return this.json("POST", "/api/exec", { json: { command, ...fields } });
  }

  /** Starts a session; its token is in the answer only. */
  createSession(req: CreateSessionRequest = {}): Promise<SessionCreated> {
    return this.json("POST", "/api/sessions", { json: req });
  }

  getSession(id: string): Promise<Session> {
    return this.json("GET", `/api/sessions/${seg(id)}`);
  }

  async listSessions(): Promise<Session[]> {
    return (await this.json<{ sessions: Session[] | null }>("GET", "/api/sessions")).sessions ?? [];
  }

  /** Ends a session. */
  deleteSession(id: string): Promise<Session> {
    return this.json("DELETE", `/api/sessions/${seg(id)}`);
  }

  /**
   * Runs a command in a session, yielding its stream's chunks as they come:
   * "started", then "stdout"/"stderr" (text in data, or bytes in
   * data_base64; chunkBytes decodes either), "gap", "heartbeat", and last
   * "exit" with exit_code. A string runs with sh -c; an array is an argv.
   * Leaving the loop early leaves the command running.
   */
  async *exec(sessionId: string, command: string | string[], opts: ExecOptions = {}): AsyncGenerator<ExecChunk, void, undefined> {
    const resp = await this.request("POST", `/api/sessions/${seg(sessionId)}/exec`, {
      json: { command, cwd: opts.cwd, env: opts.env, stdin: opts.stdin, timeout_seconds: opts.timeoutSeconds },
      accept: "application/x-ndjson",
      signal: opts.signal,
    });
    for await (const line of lines(resp)) {
      if (line.trim()) yield JSON.parse(line) as ExecChunk;
    }
  }

  /** Starts a command in a session and answers its exec id at once. */
  execDetached(sessionId: string, command: string | string[], opts: Omit<ExecOptions, "signal"> = {}): Promise<ExecStarted> {
    return this.json("POST", `/api/sessions/${seg(sessionId)}/exec`, {
      json: { command, cwd: opts.cwd, env: opts.env, stdin: opts.stdin, timeout_seconds: opts.timeoutSeconds, detach: true },
    });
  }

  /** The tools, as OpenAI-style function definitions. */
  tools(): Promise<Tool[]> {
    return this.json("GET", "/api/tools");
  }

  callTool(name: string, args: Record<string, unknown> = {}): Promise<unknown> {
    return this.json("POST", `/api/tools/${seg(name)}`, { json: args });
  }

  /** Uploads files (by name) as attachments, all or none. */
  upload(files: Record<string, Blob | Uint8Array | string>): Promise<UploadResponse> {
    const form = new FormData();
    for (const [name, content] of Object.entries(files)) {
      form.append("file", content instanceof Blob ? content : new Blob([content as BlobPart]), name);
    }
    return this.json("POST", "/api/attachments", { body: form });
  }

  downloadAttachment(id: string): Promise<Uint8Array> {
    return this.bytes(`/api/attachments/${seg(id)}`);
  }

  async listWorkspaces(): Promise<Project[]> {
    return (await this.json<{ workspaces: Project[] | null }>("GET", "/api/workspaces")).workspaces ?? [];
  }

  createWorkspace(name: string, opts: { initGit?: boolean } = {}): Promise<Project> {
    return this.json("POST", "/api/workspaces", { json: { name, init_git: opts.initGit ?? false } });
  }

  /** A directory's entries, or a file (its content cut at the server's read limit), of the shared workspace. */
  readShared(path = "", opts: { recursive?: boolean } = {}): Promise<WorkspaceListing | WorkspaceFile> {
    return this.json("GET", `/api/workspace/${pathOf(path)}`, { query: { recursive: opts.recursive || undefined } });
  }

  /** Writes a file of the shared workspace. */
  writeShared(path: string, content: Uint8Array | string): Promise<WorkspaceEntry> {
    return this.json("PUT", `/api/workspace/${pathOf(path)}`, {
      body: typeof content === "string" ? content : new Blob([content as BlobPart]),
      contentType: "application/octet-stream",
    });
  }
}
