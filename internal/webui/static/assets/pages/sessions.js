// Sessions: the list, a form to start one, and a console that streams an
// exec's output as the command prints it.

import { h, replace, field, select, errorBox, statusBadge, time, labelChips, copyButton, parseLabels, fmtDuration } from '../dom.js';
import { api, get, request, readLines } from '../api.js';
import { navigate } from '../app.js';

// created holds a new session's token until its page has shown it once:
// it is never put in a URL.
let created = null;

const runtimes = [['', 'server default'], 'local', 'gvisor', 'docker'];
const networks = [['', 'none (default)'], 'none', 'allowlist', 'open'];

export async function sessionsPage(main, { signal }) {
  const f = {
    runtime: select('runtime', runtimes, ''),
    image: h('input', { type: 'text', name: 'image', placeholder: 'for docker, e.g. python:3.12-slim' }),
    network: select('network', networks, ''),
    workspace: h('input', { type: 'text', name: 'workspace', placeholder: 'a named workspace (optional)' }),
    idle: h('input', { type: 'number', name: 'idle_timeout', min: 1, placeholder: 'seconds' }),
    labels: h('input', { type: 'text', name: 'labels', placeholder: 'k=v, k2=v2' }),
  };
  const err = h('div');
  const form = h('form', { class: 'form card', id: 'create-session', onsubmit: async (e) => {
    e.preventDefault();
    try {
      const req = {};
      if (f.runtime.value) req.runtime = f.runtime.value;
      if (f.image.value.trim()) req.image = f.image.value.trim();
      if (f.network.value) req.network = f.network.value;
      if (f.workspace.value.trim()) req.workspace = f.workspace.value.trim();
      if (f.idle.value) req.idle_timeout = Number(f.idle.value);
      const labels = parseLabels(f.labels.value);
      if (Object.keys(labels).length) req.labels = labels;
      const r = await api('POST', '/api/sessions', req, { signal });
      created = { id: r.session_id, token: r.token };
      navigate('/sessions/' + encodeURIComponent(r.session_id));
    } catch (ex) { replace(err, errorBox(ex)); }
  } },
  h('h2', {}, 'Start a session'),
  h('div', { class: 'grid-3' }, field('Runtime', f.runtime), field('Image', f.image), field('Network', f.network)),
  h('div', { class: 'grid-3' }, field('Workspace', f.workspace), field('Idle timeout', f.idle), field('Labels', f.labels)),
  err, h('div', { class: 'actions' }, h('button', { class: 'btn btn-primary', type: 'submit' }, 'Start session')));

  const list = (await get('/api/sessions', { signal })).sessions || [];
  replace(main, h('header', { class: 'page-head' }, h('h1', {}, 'Sessions'), h('span', { class: 'muted' }, String(list.length))),
    h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
      h('thead', {}, h('tr', {}, ['Status', 'Session', 'Runtime', 'Image', 'Workspace', 'Execs', 'Created', 'Last used', 'Labels'].map((c) => h('th', {}, c)))),
      h('tbody', {}, list.length ? list.map((s) => h('tr', {},
        h('td', {}, statusBadge(s.status), s.end_reason ? h('div', { class: 'muted small' }, s.end_reason) : null,
          s.status === 'suspended' ? h('div', { class: 'muted small' }, s.memory_kept ? 'memory kept' : 'files kept') : null),
        h('td', { class: 'mono' }, h('a', { href: '/sessions/' + encodeURIComponent(s.session_id) }, s.session_id)),
        h('td', {}, s.runtime), h('td', {}, s.image || ''), h('td', {}, s.workspace || ''),
        h('td', {}, String(s.execs)), h('td', { class: 'nowrap' }, time(s.created_at)), h('td', { class: 'nowrap' }, time(s.last_used_at)),
        h('td', {}, labelChips(s.labels)))) : h('tr', {}, h('td', { colspan: 9, class: 'empty' }, 'No sessions.'))))),
    form);
}

export async function sessionPage(main, { signal, params }) {
  const id = params.id;
  const base = '/api/sessions/' + encodeURIComponent(id);
  let s = await get(base, { signal });
  const fresh = created && created.id === id ? created.token : '';
  created = null;

  const head = h('header', { class: 'page-head' });
  const notice = h('div');
  const historyList = h('ol', { class: 'history', id: 'session-history' });
  const readHistory = async () => (await get(base + '/history', { signal }).catch(() => ({ events: [] }))).events || [];
  // drawHistory lists the session's lifecycle; its commands are the
  // console's.
  const drawHistory = async (evs) => {
    evs = evs || await readHistory();
    replace(historyList, evs.filter((e) => !e.type.startsWith('exec_')).map((e) => h('li', {}, h('span', { class: 'nowrap muted' }, time(e.at)), ' ',
      h('strong', {}, e.type.replace(/^session_/, '').replace(/_/g, ' ')), ' ', historyDetail(e))));
  };
  // act runs one of the head's buttons' requests, then draws the session
  // as it is now.
  const act = async (method, path, body, say) => {
    try {
      const r = await api(method, base + path, body, { signal });
      replace(notice, say ? h('div', { class: 'alert alert-info' }, say(r)) : null);
    } catch (ex) { replace(notice, errorBox(ex)); }
    s = await get(base, { signal }).catch(() => s);
    drawHead();
    drawHistory();
  };
  const drawHead = () => {
    const live = s.status === 'running';
    const btn = (label, cls, hidden, onclick) => h('button', { type: 'button', name: label.toLowerCase().replace(' ', '-'), class: 'btn ' + cls, hidden, onclick }, label);
    const del = btn('End session', 'btn-danger', s.status === 'ended', () => {
      if (confirm('End this session? Its sandbox is removed.')) act('DELETE', '');
    });
    const suspend = btn('Suspend', '', !live, () => act('POST', '/suspend', {}, (r) => r.note));
    const resume = btn('Resume', 'btn-primary', s.status !== 'suspended', () => act('POST', '/resume', {}));
    const fork = btn('Fork', '', s.status === 'ended', () => act('POST', '/fork', { count: 1 }, (r) =>
      h('span', {}, 'Forked: ', ...r.forks.map((f) => h('span', {}, h('a', { class: 'mono', href: '/sessions/' + encodeURIComponent(f.session_id) }, f.session_id),
        ' (token, shown once: ', h('code', {}, f.token), ' ', copyButton(f.token), ') ')), r.note)));
    input.disabled = !live && s.status !== 'suspended';
    replace(head, statusBadge(s.status), h('h1', { class: 'mono' }, s.session_id),
      s.status === 'suspended' ? h('span', { class: 'muted' }, s.memory_kept ? 'memory and processes kept' : 'files kept; its processes ended') : null,
      h('div', { class: 'spacer' }), suspend, resume, fork, del);
  };
  const screen = h('pre', { class: 'console', id: 'session-console', 'aria-live': 'polite' });
  const input = h('input', { type: 'text', name: 'command', class: 'mono', placeholder: s.status === 'ended' ? 'the session has ended' : 'a command, run with sh -c' + (s.status === 'suspended' ? ' (resumes the session first)' : ''), autocomplete: 'off', disabled: s.status === 'ended' });
  drawHead();
  const run = h('button', { class: 'btn btn-primary', type: 'submit' }, 'Run');
  const history = [];
  let hi = 0;
  input.addEventListener('keydown', (e) => {
    if (e.key === 'ArrowUp' && hi > 0) { input.value = history[--hi]; e.preventDefault(); }
    if (e.key === 'ArrowDown' && hi < history.length) { input.value = history[++hi] || ''; e.preventDefault(); }
  });
  const form = h('form', { class: 'console-input', onsubmit: async (e) => {
    e.preventDefault();
    const cmd = input.value;
    if (!cmd.trim()) return;
    history.push(cmd);
    hi = history.length;
    input.value = '';
    run.disabled = true;
    screen.append(h('span', { class: 'console-cmd' }, '$ ' + cmd + '\n'));
    try {
      const r = await request('POST', base + '/exec', { body: { command: cmd }, headers: { Accept: 'application/x-ndjson' }, signal });
      await readLines(r, (line) => {
        if (!line) return;
        const c = JSON.parse(line);
        if (c.type === 'started' || c.type === 'heartbeat') return;
        if (c.type === 'gap') {
          screen.append(h('span', { class: 'console-err' }, `[${c.bytes} bytes of output not kept]\n`));
        } else if (c.type === 'exit') {
          screen.append(h('span', { class: 'console-exit' + (c.exit_code ? ' failed' : '') },
            `[exit ${c.exit_code}, ${fmtDuration(c.duration_ms)}${c.error ? ', ' + c.error : ''}]\n`));
        } else {
          const text = c.data_base64 ? atob(c.data_base64) : c.data || '';
          screen.append(c.type === 'stderr' ? h('span', { class: 'console-err' }, text) : text);
        }
        screen.scrollTop = screen.scrollHeight;
      });
    } catch (ex) {
      screen.append(h('span', { class: 'console-err' }, (ex.message || String(ex)) + '\n'));
    } finally {
      run.disabled = false;
      input.focus();
      s = await get(base, { signal }).catch(() => s);
      drawHead();
      drawHistory();
    }
  } }, h('span', { class: 'prompt mono' }, '$'), input, run);

  const evs = await readHistory();
  showEarlier(screen, evs, history);
  hi = history.length;
  replace(main, head,
    fresh ? h('div', { class: 'alert alert-info' }, h('strong', {}, 'Session token (shown once): '), h('code', {}, fresh), ' ', copyButton(fresh),
      h('div', { class: 'small' }, 'It runs commands in this session and nothing else.')) : null,
    h('section', { class: 'card meta' }, h('dl', { class: 'meta-grid' },
      h('dt', {}, 'Runtime'), h('dd', {}, s.runtime + (s.image ? ' · ' + s.image : '')),
      h('dt', {}, 'Network'), h('dd', {}, s.network),
      h('dt', {}, 'Workspace'), h('dd', {}, s.workspace || 'its own directory'),
      s.forked_from ? [h('dt', {}, 'Forked from'), h('dd', {}, h('a', { class: 'mono', href: '/sessions/' + encodeURIComponent(s.forked_from) }, s.forked_from))] : null,
      h('dt', {}, 'Created'), h('dd', {}, time(s.created_at)),
      h('dt', {}, 'Idle timeout'), h('dd', {}, fmtDuration(s.idle_timeout * 1000)),
      h('dt', {}, 'Max lifetime'), h('dd', {}, fmtDuration(s.max_lifetime * 1000)),
      h('dt', {}, 'Labels'), h('dd', {}, labelChips(s.labels) || ''))),
    notice,
    h('section', { class: 'card' }, h('h2', {}, 'Console'), h('p', { class: 'muted small' }, 'Commands start in /workspace/session; output streams as it is printed.'), screen, form),
    h('section', { class: 'card' }, h('h2', {}, 'History'), historyList));
  drawHistory(evs);
  input.focus();
}

// shPrefix begins the record of a command given as a string.
const shPrefix = '/bin/sh -c ';

// earlierShown is how many of the commands run before the page opened
// the console shows, the last ones.
const earlierShown = 100;

// showEarlier puts the commands run in the session before the page opened
// (exec_started and exec_ended of its history) on screen, each with when
// it started and how it ended, and in the input's history (arrow up). The
// command is the session's, text a worker or anyone with its token wrote:
// it goes into the page as text only.
function showEarlier(screen, evs, history) {
  const ends = new Map(evs.filter((e) => e.type === 'exec_ended').map((e) => [e.detail?.exec_id, e.detail || {}]));
  const started = evs.filter((e) => e.type === 'exec_started' && typeof e.detail?.command === 'string');
  if (!started.length) return;
  const shown = started.slice(-earlierShown);
  screen.append(h('span', { class: 'muted' }, started.length > shown.length
    ? `[${started.length} earlier commands, the last ${shown.length} shown; their output is not]\n`
    : `[${started.length} earlier command${started.length === 1 ? '' : 's'}; their output is not shown]\n`));
  for (const e of shown) {
    // The record is the argv joined; a command given as a string (the
    // console's) ran as sh -c, shown and recalled as it was typed.
    const typed = e.detail.command.startsWith(shPrefix);
    const cmd = typed ? e.detail.command.slice(shPrefix.length) : e.detail.command;
    const end = ends.get(e.detail.exec_id);
    if (typed) history.push(cmd);
    screen.append(h('span', { class: 'console-earlier', dataset: { execId: String(e.detail.exec_id || '') } },
      h('span', { class: 'console-cmd' }, '$ ' + cmd), ' ', h('span', { class: 'muted' }, time(e.at)), '\n',
      end ? h('span', { class: 'console-exit' + (end.exit_code ? ' failed' : '') },
        `[exit ${end.exit_code}, ${fmtDuration(end.duration_ms)}${end.error ? ', ' + end.error : ''}]\n`)
        : h('span', { class: 'muted' }, '[no end recorded yet]\n')));
  }
  screen.scrollTop = screen.scrollHeight;
}

// historyDetail is what a lifecycle event says, in a few words.
function historyDetail(e) {
  const d = e.detail || {};
  const secs = typeof d.seconds === 'number' ? ` in ${fmtDuration(d.seconds * 1000)}` : '';
  switch (e.type) {
    case 'session_suspended': return (d.memory_kept ? 'memory and processes kept' : 'files kept') + secs + (d.execs_ended ? `, ${d.execs_ended} commands ended` : '');
    case 'session_resumed': return (d.memory_kept ? 'restored as it was' : 'a fresh sandbox on its files') + secs;
    case 'session_forked': {
      const n = (d.forks || []).length;
      const kept = d.memory_kept
        ? ', memory and processes copied' + (d.execs_inherited ? `, ${d.execs_inherited} running command${d.execs_inherited === 1 ? '' : 's'} going on in each` : '')
        : ' (files only)';
      const paused = typeof d.paused_seconds === 'number' ? `; the source paused ${fmtDuration(d.paused_seconds * 1000)}` : '';
      return `${n} fork${n === 1 ? '' : 's'}, ${d.files} files copied` + secs + kept + paused;
    }
    case 'session_created': return [d.runtime, d.image, d.forked_from ? 'forked from ' + d.forked_from : ''].filter(Boolean).join(' · ');
    case 'session_ended': return [d.reason, d.error].filter(Boolean).join(': ');
    case 'session_network_changed': return d.network || '';
    case 'session_adopted': return 'by ' + (d.replica || '');
    default: return '';
  }
}
