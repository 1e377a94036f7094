// The API client: every request carries the bearer token (never in a URL,
// never in a cookie), so no other site can make the browser act, and
// streams are read with fetch() because EventSource cannot send headers.

const tokenKey = 'corral.token';

// The token lives in this origin's localStorage until "Forget token": the
// UI asks for it once per browser, and a shared link opens signed in.
export function token() { return localStorage.getItem(tokenKey) || ''; }
export function setToken(t) { localStorage.setItem(tokenKey, t); }
export function forgetToken() { localStorage.removeItem(tokenKey); }

// APIError is an error answer: the server's message, its field errors and
// the HTTP status.
export class APIError extends Error {
  constructor(status, message, fields) {
    super(message);
    this.status = status;
    this.fields = fields || [];
  }
}

// onUnauthorized is called when the server answers 401 (no token, or a
// wrong one); the app asks for the token and retries the page.
let unauthorized = () => {};
export function onUnauthorized(fn) { unauthorized = fn; }

function headers(extra) {
  const hd = new Headers(extra || {});
  const t = token();
  if (t) hd.set('Authorization', 'Bearer ' + t);
  return hd;
}

// send is fetch, with a GET or HEAD sent again (twice at most) when it got
// no answer at all: Chromium aborts every request in flight when the
// host's network changes (net::ERR_NETWORK_CHANGED; see boot.js), and
// fetch then rejects with a TypeError. Those methods change nothing, so
// sending one again is safe; any other method fails at once, and so does
// a request its signal aborted.
async function send(path, init) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fetch(path, init);
    } catch (err) {
      if (!(err instanceof TypeError) || (init.method !== 'GET' && init.method !== 'HEAD') || attempt > 2 || init.signal?.aborted) throw err;
      await new Promise((res) => setTimeout(res, 100 * attempt));
    }
  }
}

// request sends a request and returns the Response of a 2xx; anything else
// throws an APIError with the server's message.
export async function request(method, path, { body, headers: extra, signal } = {}) {
  const hd = headers(extra);
  let payload = body;
  if (body !== undefined && !(body instanceof FormData) && !(body instanceof Blob) && typeof body !== 'string') {
    hd.set('Content-Type', 'application/json');
    payload = JSON.stringify(body);
  }
  const r = await send(path, { method, headers: hd, body: payload, signal, cache: 'no-store', credentials: 'omit' });
  if (r.ok) return r;
  let msg = r.status + ' ' + r.statusText;
  let fields = [];
  try {
    const e = await r.json();
    if (e && typeof e.error === 'string') msg = e.error;
    if (e && Array.isArray(e.fields)) fields = e.fields;
  } catch { /* not JSON */ }
  if (r.status === 401) unauthorized();
  throw new APIError(r.status, msg, fields);
}

// api sends JSON (if body is given) and returns the JSON answer.
export async function api(method, path, body, opts = {}) {
  const r = await request(method, path, { ...opts, body });
  const text = await r.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path, opts) => api('GET', path, undefined, opts);

// blob fetches a file with the token and returns its bytes as a Blob of
// the type the server declared.
export async function blob(path, opts) {
  const r = await request('GET', path, opts);
  return r.blob();
}

// readChunks calls fn with each decoded chunk of a streamed text answer
// until it ends or signal aborts.
export async function readChunks(r, fn) {
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    fn(value);
  }
}

// readLines calls fn with each line of a streamed answer.
export async function readLines(r, fn) {
  let buf = '';
  await readChunks(r, (chunk) => {
    buf += chunk;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      fn(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  });
  if (buf) fn(buf);
}

// parseSSE turns an event stream's lines into events {id, event, data}.
export function sseParser(fn) {
  let ev = { data: [] };
  return (raw) => {
    const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
    if (line === '') {
      if (ev.data.length) fn({ id: ev.id, event: ev.event || 'message', data: ev.data.join('\n') });
      ev = { data: [] };
      return;
    }
    if (line.startsWith(':')) return;
    const i = line.indexOf(':');
    const name = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? '' : line.slice(i + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (name === 'data') ev.data.push(value);
    else if (name === 'id') ev.id = value;
    else if (name === 'event') ev.event = value;
  };
}

// subscribe follows an SSE route of events (/api/events,
// /api/tasks/{id}/events) and calls onEvent with each event's JSON. It
// starts after `after` (an event id, or "now"), reconnects with backoff
// when the stream breaks, resuming after the last event seen (Last-Event-ID),
// and calls onState('live' | 'reconnecting'). It stops when signal aborts.
export function subscribe(path, { after, signal, onEvent, onOpen, onState = () => {} }) {
  let last = after || '';
  let delay = 1000;
  (async () => {
    while (!signal.aborted) {
      try {
        const hd = { Accept: 'text/event-stream' };
        const url = last === 'now' ? path + (path.includes('?') ? '&' : '?') + 'after=now' : path;
        if (last && last !== 'now') hd['Last-Event-ID'] = last;
        const r = await request('GET', url, { headers: hd, signal });
        onState('live');
        delay = 1000;
        if (onOpen) onOpen();
        await readLines(r, sseParser((e) => {
          if (e.id) last = e.id;
          try { onEvent(JSON.parse(e.data)); } catch (err) { console.error(err); }
        }));
      } catch (err) {
        if (signal.aborted) return;
        // A 429 (the token's request rate) passes like a restart's 503.
        if (err instanceof APIError && err.status !== 503 && err.status !== 502 && err.status !== 429) {
          onState('error', err);
          return;
        }
      }
      if (signal.aborted) return;
      onState('reconnecting');
      await new Promise((res) => setTimeout(res, delay));
      delay = Math.min(delay * 2, 15000);
    }
  })();
}
