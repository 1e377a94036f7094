// A task's page: its state and result, live progress (the agent's text and
// tool calls as they happen), output files, transcript, stderr, prompt,
// events and the raw result; cancel and follow up.

import { h, replace, statusBadge, fmtSize, fmtShort, firstLine, labelChips, copyButton, errorBox, encodePath, time } from '../dom.js';
import { api, get, request, blob, subscribe, readChunks } from '../api.js';
import { navigate } from '../app.js';
import { renderMarkdown } from '../markdown.js';
import { highlight } from '../highlight.js';
import { render as renderFile, download, kindOf } from '../preview.js';
import { duration } from './tasks.js';

const terminal = new Set(['success', 'failed', 'timeout', 'cancelled']);

export async function taskPage(main, { signal, params }) {
  const id = params.id;
  const base = '/api/tasks/' + encodeURIComponent(id);
  // The events first, then the task: the task is then at least as new as
  // the last event read, and every later event comes over the stream and
  // has the task read again. (The other way round, an event between the
  // two reads, task_started say, left the page on "starting".)
  const evs = (await get(base + '/events', { signal })).events || [];
  let t = await get(base, { signal });

  const head = h('header', { class: 'page-head task-head' });
  const meta = h('section', { class: 'card meta' });
  const result = h('section', { class: 'result' });
  const outputs = h('section', { class: 'card' });
  const feed = h('ol', { class: 'feed', 'aria-live': 'polite' });
  const feedCard = h('section', { class: 'card' }, h('h2', {}, 'Progress'), feed);
  const followUp = h('section');
  const eventsBody = h('tbody');
  const tabsBar = h('div', { class: 'tabs', role: 'tablist' });
  const panel = h('div', { class: 'tab-panel' });

  const overview = h('div', { class: 'overview' }, h('div', { class: 'overview-main' }, result, outputs, followUp), h('div', { class: 'overview-side' }, feedCard));
  const tabs = {
    overview: ['Overview', () => overview],
    transcript: ['Transcript', () => logView('agent')],
    stderr: ['Stderr', () => logView('stderr')],
    prompt: ['Prompt', promptView],
    events: ['Events', () => h('div', { class: 'table-wrap' }, h('table', { class: 'table table-compact events-table' },
      h('thead', {}, h('tr', {}, ['Time', 'Type', 'Actor', 'Data'].map((c) => h('th', {}, c)))), eventsBody))],
    result: ['Result', resultView],
  };
  let tabSignal = null; // aborts a tab's stream when another tab opens
  function openTab(name) {
    if (tabSignal) tabSignal.abort();
    tabSignal = new AbortController();
    signal.addEventListener('abort', () => tabSignal.abort(), { once: true });
    for (const b of tabsBar.children) b.setAttribute('aria-selected', String(b.dataset.tab === name));
    replace(panel, tabs[name][1](tabSignal.signal));
    const url = location.pathname + (name === 'overview' ? '' : '#' + name);
    history.replaceState(null, '', url);
  }
  for (const [name, [label]] of Object.entries(tabs)) {
    tabsBar.append(h('button', { type: 'button', role: 'tab', class: 'tab', dataset: { tab: name }, onclick: () => openTab(name) }, label));
  }

  replace(main, head, meta, tabsBar, panel);

  function drawHead() {
    const cancel = h('button', { type: 'button', class: 'btn btn-danger', id: 'cancel-task' }, t.cancel_requested ? 'Cancelling…' : 'Cancel');
    cancel.disabled = !!t.cancel_requested;
    cancel.addEventListener('click', async () => {
      if (!confirm('Cancel this task?')) return;
      cancel.disabled = true;
      cancel.textContent = 'Cancelling…';
      try {
        t = await api('POST', base + '/cancel', undefined, { signal });
        drawAll();
      } catch (err) {
        cancel.disabled = false;
        cancel.textContent = 'Cancel';
        result.prepend(errorBox(err));
      }
    });
    replace(head,
      h('div', { class: 'title-row' }, statusBadge(t.status), h('h1', {}, firstLine(t.task_description, 100) || t.task_id)),
      h('div', { class: 'sub-row' }, h('span', { class: 'mono muted' }, t.task_id), copyButton(t.task_id, 'Copy id'),
        h('div', { class: 'spacer' }),
        terminal.has(t.status) ? h('a', { class: 'btn', href: '#follow-up', onclick: (e) => { e.preventDefault(); openTab('overview'); followUp.querySelector('textarea').focus(); } }, 'Follow up') : cancel));
    document.title = firstLine(t.task_description, 60) + ' · Corral';
  }

  function drawMeta() {
    const row = (k, v) => (v == null || v === '' ? null : [h('dt', {}, k), h('dd', {}, v)]);
    const res = t.resources || {};
    replace(meta, h('dl', { class: 'meta-grid' },
      row('Agent', [t.agent, t.model ? ' · ' + t.model : '']),
      row('Runtime', [t.runtime, t.image ? ' · ' + t.image : '']),
      row('Network', t.network),
      row('Created', time(t.created_at, fmtShort(t.created_at))),
      row('Started', t.started_at && time(t.started_at, fmtShort(t.started_at))),
      row('Ended', t.completed_at && time(t.completed_at, fmtShort(t.completed_at))),
      row('Duration', duration(t)),
      row('Exit code', t.exit_code),
      row('Timeout', t.timeout_seconds ? t.timeout_seconds + ' s' : t.timeout_minutes ? t.timeout_minutes + ' min' : ''),
      row('Resources', [res.memory_bytes ? fmtSize(res.memory_bytes) : '', res.cpu_millis ? ` · ${res.cpu_millis / 1000} CPU` : '', res.pids ? ` · ${res.pids} pids` : ''].join('')),
      row('Conversation', t.conversation_id && h('a', { href: '/tasks?conversation_id=' + encodeURIComponent(t.conversation_id) }, t.conversation_id)),
      row('User', [t.user_name, t.interface_type ? ' · ' + t.interface_type : ''].join('')),
      row('Workspace', t.workspace && h('a', { href: '/workspace/projects/' + encodeURIComponent(t.workspace) + '/' }, t.workspace)),
      row('Follows', t.follow_up_of && h('a', { href: '/tasks/' + encodeURIComponent(t.follow_up_of) }, t.follow_up_of)),
      row('Labels', labelChips(t.labels)),
      row('Cost', t.cost_usd ? '$' + t.cost_usd.toFixed(4) : ''),
      row('Tokens', t.usage ? `${t.usage.input_tokens} in · ${t.usage.output_tokens} out` : ''),
    ));
  }

  function drawResult() {
    replace(result,
      t.error_message ? h('div', { class: 'alert alert-error' }, h('strong', {}, 'Error: '), t.error_message) : null,
      t.summary ? h('div', { class: 'card' }, h('h2', {}, 'Summary'), renderMarkdown(t.summary)) : null,
      !terminal.has(t.status) ? h('p', { class: 'muted' }, t.status === 'running' ? 'The agent is working; its progress appears below as it happens.' : `The task is ${t.status}.`) : null);
  }

  // Output files: images are shown at once; any file opens in a preview.
  const preview = h('div', { class: 'file-preview' });
  let drawnOutputs = '';
  function drawOutputs() {
    const files = t.output_files || [];
    const key = JSON.stringify(files);
    if (key === drawnOutputs) return;
    drawnOutputs = key;
    const gallery = h('div', { class: 'gallery' });
    replace(outputs, h('h2', {}, 'Output files ', h('span', { class: 'muted' }, String(t.output_files_total || files.length))),
      files.length ? null : h('p', { class: 'muted' }, terminal.has(t.status) ? 'No output files.' : 'None yet.'),
      t.output_files_note ? h('p', { class: 'muted' }, t.output_files_note) : null,
      gallery,
      files.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'table table-compact files-table' },
        h('thead', {}, h('tr', {}, ['Name', 'Type', 'Size', ''].map((c) => h('th', {}, c)))),
        h('tbody', {}, files.map((f) => h('tr', {},
          h('td', { class: 'mono' }, f.name),
          h('td', { class: 'muted' }, f.type),
          h('td', { class: 'nowrap' }, fmtSize(f.size)),
          h('td', { class: 'nowrap actions-cell' },
            h('button', { type: 'button', class: 'btn btn-small', onclick: () => show(f) }, 'View'),
            h('button', { type: 'button', class: 'btn btn-small btn-ghost', onclick: () => save(f) }, 'Download'))))))) : null,
      preview);
    for (const f of files.filter((f) => kindOf(f.name, f.type) === 'image').slice(0, 12)) {
      const fig = h('figure', { class: 'thumb' }, h('div', { class: 'muted small' }, 'Loading…'), h('figcaption', { class: 'mono small' }, f.name));
      gallery.append(fig);
      fileBytes(f).then((b) => fig.firstChild.replaceWith(renderFile({ ...f, bytes: b }))).catch((err) => fig.firstChild.replaceWith(errorBox(err)));
    }
  }
  const filePath = (f) => base + '/files/' + encodePath(f.name);
  async function fileBytes(f) { return new Uint8Array(await (await blob(filePath(f), { signal })).arrayBuffer()); }
  async function show(f) {
    replace(preview, h('h3', { class: 'mono' }, f.name), h('p', { class: 'muted' }, 'Loading…'));
    try {
      const bytes = await fileBytes(f);
      replace(preview, h('div', { class: 'preview-head' }, h('h3', { class: 'mono' }, f.name),
        h('button', { type: 'button', class: 'btn btn-small btn-ghost', onclick: () => download(f.name, bytes) }, 'Download')),
      renderFile({ ...f, bytes }));
      preview.scrollIntoView({ block: 'nearest' });
    } catch (err) {
      replace(preview, errorBox(err));
    }
  }
  async function save(f) {
    try { download(f.name, await fileBytes(f)); } catch (err) { replace(preview, errorBox(err)); }
  }

  function drawFollowUp() {
    if (!terminal.has(t.status)) { followUp.replaceChildren(); return; }
    if (followUp.firstChild) return;
    const text = h('textarea', { name: 'task_description', rows: 3, required: true, placeholder: 'What should the agent do next? It sees this task\'s output in context/previous/.' });
    const err = h('div');
    followUp.append(h('form', { class: 'card', id: 'follow-up', onsubmit: async (e) => {
      e.preventDefault();
      const req = { task_description: text.value, follow_up_of: t.task_id, agent: t.agent, runtime: t.runtime, network: t.network };
      for (const k of ['model', 'command', 'image', 'labels', 'conversation_id', 'interface_type', 'user_name', 'workspace']) if (t[k]) req[k] = t[k];
      try {
        const r = await api('POST', '/api/tasks', req, { signal });
        navigate('/tasks/' + encodeURIComponent(r.task_id));
      } catch (ex) { replace(err, errorBox(ex)); }
    } }, h('h2', {}, 'Follow up'), text, err, h('div', { class: 'actions' }, h('button', { class: 'btn btn-primary', type: 'submit' }, 'Send follow-up'))));
  }

  // A task that ended without reporting progress (the command agent
  // reports none) needs no empty feed.
  function drawFeed() { feedCard.hidden = terminal.has(t.status) && !!feed.querySelector('.empty-feed'); }
  function drawAll() { drawHead(); drawMeta(); drawResult(); drawOutputs(); drawFollowUp(); drawFeed(); }

  // Events: the table, the progress feed, and a re-read of the task when
  // one changes it.
  let lastID = '';
  function addEvent(e) {
    lastID = e.event_id;
    eventsBody.append(h('tr', {},
      h('td', { class: 'nowrap' }, time(e.recorded_at, fmtShort(e.recorded_at))),
      h('td', { class: 'mono' }, e.type),
      h('td', {}, e.actor || ''),
      h('td', {}, h('details', {}, h('summary', {}, firstLine(JSON.stringify(e.data), 80)), h('pre', { class: 'code' }, highlight(JSON.stringify(e.data, null, 2), 'json'))))));
    if (e.type === 'task_progress') {
      feed.append(progressItem(e));
      if (feed.childElementCount > 2000) feed.firstChild.remove();
    }
    if (e.type === 'task_events_compacted') {
      feed.append(h('li', { class: 'muted' }, `Retention removed this run's progress and egress records (${e.data.removed} events) a while after the task ended.`));
    }
  }
  for (const e of evs) addEvent(e);
  if (!feed.childElementCount) feed.append(h('li', { class: 'muted empty-feed' }, 'No progress reported yet.'));

  drawAll();
  openTab(tabs[location.hash.slice(1)] ? location.hash.slice(1) : 'overview');

  let rereading = null;
  subscribe(base + '/events', {
    after: lastID,
    signal,
    onEvent: (e) => {
      feed.querySelector('.empty-feed')?.remove();
      addEvent(e);
      if (e.type === 'task_progress' || e.type === 'egress_connection' || rereading) return;
      rereading = setTimeout(async () => {
        rereading = null;
        try { t = await get(base, { signal }); drawAll(); } catch { /* left */ }
      }, 100);
    },
  });
  const tick = setInterval(() => { if (t.started_at && !t.completed_at) drawMeta(); }, 1000);
  signal.addEventListener('abort', () => clearInterval(tick));

  // logView streams a log (following it while the task runs).
  function logView(stream) {
    return (tabSig) => {
      const pre = h('pre', { class: 'code log' });
      const box = h('div', {}, pre);
      const follow = terminal.has(t.status) ? '' : '&follow=1';
      request('GET', `${base}/logs?stream=${stream}${follow}`, { signal: tabSig })
        .then((r) => readChunks(r, (c) => { pre.append(c); }))
        .then(() => { if (!pre.textContent) box.prepend(h('p', { class: 'muted' }, stream === 'stderr' ? 'Nothing on stderr.' : 'No transcript.')); })
        .catch((err) => { if (!tabSig.aborted) box.prepend(errorBox(err)); });
      return box;
    };
  }
  function promptView(tabSig) {
    const box = h('div', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…'));
    request('GET', base + '/logs?stream=prompt', { signal: tabSig }).then((r) => r.text())
      .then((text) => replace(box, h('p', { class: 'muted' }, 'prompt.md, as the agent reads it:'), renderMarkdown(text)))
      .catch((err) => replace(box, errorBox(err)));
    return box;
  }
  function resultView(tabSig) {
    const box = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
    get(base + '/result', { signal: tabSig })
      .then((r) => replace(box, h('pre', { class: 'code' }, highlight(JSON.stringify(r, null, 2), 'json'))))
      .catch((err) => replace(box, errorBox(err)));
    return box;
  }
}

function progressItem(e) {
  const p = e.data || {};
  const more = p.coalesced ? h('span', { class: 'muted small' }, ` (+${p.coalesced} more)`) : null;
  const item = (cls, kind, ...body) => h('li', { class: 'feed-item ' + cls },
    h('span', { class: 'feed-time' }, new Date(e.recorded_at).toLocaleTimeString(undefined, { hour12: false })),
    h('span', { class: 'feed-kind' }, kind), h('span', { class: 'feed-body' }, body, more));
  switch (p.kind) {
    case 'tool_use':
      return item('feed-tool', 'tool', h('code', {}, p.tool || 'tool'), ' ', h('span', { class: 'mono' }, p.input || ''));
    case 'tool_result':
      return item('feed-result', 'result', h('code', {}, p.tool || 'tool'), ' ', h('span', { class: 'badge ' + (p.status === 'error' ? 'status-failed' : 'status-success') }, p.status || 'done'));
    case 'init':
      return item('', 'start', 'agent started');
    default:
      return item('feed-text', p.kind || 'text', p.text || '');
  }
}
