// The task list: filters and search in the URL (a filtered list is a link
// too), and live updates from the event stream without reloading.

import { h, replace, statusBadge, fmtDuration, firstLine, labelChips, time, select, errorBox } from '../dom.js';
import { get, subscribe } from '../api.js';
import { navigate } from '../app.js';

const statuses = ['', 'pending', 'queued', 'starting', 'running', 'success', 'failed', 'timeout', 'cancelled'];
const pageSize = 100;

// Task events that change what the list shows (progress and egress
// records change nothing of it).
const quiet = new Set(['task_progress', 'egress_connection']);

export async function tasksPage(main, { signal, query }) {
  const filter = {
    status: query.get('status') || '',
    conversation_id: query.get('conversation_id') || '',
    workspace: query.get('workspace') || '',
    q: query.get('q') || '',
  };
  const tasks = new Map(); // id → task, as loaded
  let cursor = '';

  const search = h('input', { type: 'search', name: 'q', placeholder: 'Search description, id, agent, labels…', value: filter.q, 'aria-label': 'Search' });
  const status = select('status', statuses.map((s) => [s, s || 'any status']), filter.status);
  const conv = h('input', { type: 'text', name: 'conversation_id', placeholder: 'conversation id', value: filter.conversation_id, 'aria-label': 'Conversation' });
  const ws = h('input', { type: 'text', name: 'workspace', placeholder: 'workspace', value: filter.workspace, 'aria-label': 'Workspace' });
  const body = h('tbody');
  const count = h('span', { class: 'muted' });
  const more = h('button', { type: 'button', class: 'btn', hidden: true }, 'Load more');
  const errors = h('div');

  replace(main,
    h('header', { class: 'page-head' }, h('h1', {}, 'Tasks'), count,
      h('div', { class: 'spacer' }), h('a', { class: 'btn btn-primary', href: '/spawn' }, 'New task')),
    h('form', { class: 'filters', role: 'search', onsubmit: (e) => e.preventDefault() }, search, status, conv, ws),
    errors,
    h('div', { class: 'table-wrap' }, h('table', { class: 'table tasks-table' },
      h('thead', {}, h('tr', {}, ['Status', 'Task', 'Agent', 'Runtime', 'Age', 'Duration', 'Conversation', 'Labels'].map((c) => h('th', {}, c)))),
      body)),
    h('div', { class: 'actions' }, more));

  // The filters live in the URL, replaced as they change.
  const syncURL = () => {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(filter)) if (v) p.set(k, v);
    history.replaceState(null, '', '/tasks' + (p.toString() ? '?' + p : ''));
  };
  const onServerFilter = () => {
    filter.status = status.value; filter.conversation_id = conv.value.trim(); filter.workspace = ws.value.trim();
    syncURL();
    load(true);
  };
  status.addEventListener('change', onServerFilter);
  conv.addEventListener('change', onServerFilter);
  ws.addEventListener('change', onServerFilter);
  search.addEventListener('input', () => { filter.q = search.value; syncURL(); draw(); });

  const params = (c) => {
    const p = new URLSearchParams({ limit: String(pageSize) });
    if (filter.status) p.set('status', filter.status);
    if (filter.conversation_id) p.set('conversation_id', filter.conversation_id);
    if (filter.workspace) p.set('workspace', filter.workspace);
    if (c) p.set('cursor', c);
    return p;
  };

  // load reads the first page again (fresh) or the next one.
  async function load(fresh) {
    try {
      const page = await get('/api/tasks?' + params(fresh ? '' : cursor), { signal });
      if (fresh) tasks.clear();
      for (const t of page.tasks || []) tasks.set(t.task_id, t);
      cursor = page.next_cursor || '';
      more.hidden = !cursor;
      errors.replaceChildren();
      draw();
    } catch (err) {
      if (!signal.aborted) replace(errors, errorBox(err));
    }
  }
  more.addEventListener('click', () => load(false));

  const matches = (t) => {
    if (filter.status && t.status !== filter.status) return false;
    if (filter.conversation_id && t.conversation_id !== filter.conversation_id) return false;
    if (filter.workspace && t.workspace !== filter.workspace) return false;
    const q = filter.q.trim().toLowerCase();
    if (!q) return true;
    const hay = [t.task_id, t.task_description, t.agent, t.model, t.runtime, t.conversation_id, t.user_name, t.workspace, t.summary,
      ...Object.entries(t.labels || {}).map(([k, v]) => k + '=' + v)].join('\n').toLowerCase();
    return q.split(/\s+/).every((w) => hay.includes(w));
  };

  function row(t) {
    const link = '/tasks/' + encodeURIComponent(t.task_id);
    return h('tr', { dataset: { id: t.task_id, status: t.status }, class: 'clickable', onclick: (e) => { if (!e.target.closest('a')) navigate(link); } },
      h('td', {}, statusBadge(t.status)),
      h('td', { class: 'task-cell' }, h('a', { href: link, class: 'task-title' }, firstLine(t.task_description, 90) || t.task_id),
        h('div', { class: 'mono muted small' }, t.task_id, t.kind === 'exec' ? ' · code_execute' : '', t.workspace ? ' · workspace ' + t.workspace : '')),
      h('td', {}, t.agent, t.model ? h('div', { class: 'muted small' }, t.model) : null),
      h('td', {}, t.runtime),
      h('td', { class: 'nowrap' }, time(t.created_at)),
      h('td', { class: 'nowrap', dataset: { duration: '' } }, duration(t)),
      h('td', { class: 'mono small' }, t.conversation_id || ''),
      h('td', {}, labelChips(t.labels)));
  }

  function draw() {
    const shown = [...tasks.values()].filter(matches).sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
    replace(body, shown.length ? shown.map(row) : h('tr', {}, h('td', { colspan: 8, class: 'empty' }, tasks.size ? 'No task matches the filters.' : 'No tasks yet.')));
    count.textContent = shown.length === tasks.size ? `${tasks.size}${cursor ? '+' : ''}` : `${shown.length} of ${tasks.size}${cursor ? '+' : ''}`;
  }

  // Live: a task's own events re-read that task; a new one appears on top.
  const pending = new Map();
  function refresh(id) {
    if (pending.has(id)) return;
    pending.set(id, setTimeout(async () => {
      pending.delete(id);
      try {
        const t = await get('/api/tasks/' + encodeURIComponent(id), { signal });
        tasks.set(t.task_id, t);
        draw();
      } catch { /* gone, or the page was left */ }
    }, 150));
  }
  subscribe('/api/events', {
    after: 'now',
    signal,
    onOpen: () => load(true), // whatever happened while not connected
    onState: (state) => { if (state === 'error') load(true); },
    onEvent: (e) => {
      if (!e.stream_id || !e.stream_id.startsWith('task/') || quiet.has(e.type)) return;
      refresh(e.stream_id.slice('task/'.length));
    },
  });
  // Ages and running durations tick.
  const tick = setInterval(() => {
    for (const tr of body.querySelectorAll('tr[data-id]')) {
      const t = tasks.get(tr.dataset.id);
      if (!t) continue;
      const cell = tr.querySelector('[data-duration]');
      if (cell && !t.completed_at && t.started_at) cell.textContent = duration(t);
      const tm = tr.querySelector('time');
      if (tm) tm.textContent = time(t.created_at).textContent;
    }
  }, 1000);
  signal.addEventListener('abort', () => { clearInterval(tick); for (const p of pending.values()) clearTimeout(p); });
}

export function duration(t) {
  if (t.duration_ms != null) return fmtDuration(t.duration_ms);
  if (!t.started_at) return '';
  const end = t.completed_at ? Date.parse(t.completed_at) : Date.now();
  return fmtDuration(end - Date.parse(t.started_at));
}
