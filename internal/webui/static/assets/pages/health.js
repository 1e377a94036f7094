// Health: the server's state, its queue, and corral doctor's findings.

import { h, replace, fmtTime } from '../dom.js';
import { get } from '../api.js';

export async function healthPage(main, { signal }) {
  replace(main, h('header', { class: 'page-head' }, h('h1', {}, 'Health')), h('p', { class: 'muted loading' }, 'Checking runtimes and agents…'));
  const r = await get('/api/health', { signal });
  const stat = (label, value, cls) => h('div', { class: 'stat card' + (cls ? ' ' + cls : '') }, h('div', { class: 'stat-value' }, String(value)), h('div', { class: 'stat-label' }, label));
  const failed = (r.checks || []).filter((c) => !c.ok && c.required).length;
  const groups = { Runtimes: [], Agents: [], Host: [] };
  for (const c of r.checks || []) {
    if (c.name.startsWith('runtime ') || c.name.startsWith('docker image') || c.name.startsWith('sandbox limits')) groups.Runtimes.push(c);
    else if (c.name.startsWith('agent ')) groups.Agents.push(c);
    else groups.Host.push(c);
  }
  const byStatus = Object.entries(r.tasks || {}).sort();
  replace(main, h('header', { class: 'page-head' }, h('h1', {}, 'Health'), h('span', { class: 'muted' }, 'Corral ' + r.version)),
    h('div', { class: 'stats' },
      stat('server', r.ready ? 'ready' : 'starting', r.ready ? 'ok' : 'warn'),
      stat('required checks failing', failed, failed ? 'bad' : 'ok'),
      stat('running', r.running),
      stat('queued', r.queue_depth),
      stat('sessions', r.sessions)),
    byStatus.length ? h('p', { class: 'muted' }, 'Tasks by status: ', byStatus.map(([s, n]) => h('a', { class: 'chip', href: '/tasks?status=' + encodeURIComponent(s) }, `${s} ${n}`))) : null,
    (r.warm || []).length ? h('section', { class: 'card' }, h('h2', {}, 'Warm sandboxes'),
      h('table', { class: 'table' },
        h('thead', {}, h('tr', {}, ['runtime', 'shape', 'ready', 'target', 'claims', 'misses', 'started', 'failed', 'destroyed'].map((c) => h('th', {}, c)))),
        h('tbody', {}, r.warm.map((p) => h('tr', {},
          [p.runtime, p.shape, p.ready, p.target, p.claims, p.misses, p.started, p.failed, p.destroyed].map((v) => h('td', {}, String(v)))))))) : null,
    Object.entries(groups).filter(([, cs]) => cs.length).map(([name, cs]) => h('section', { class: 'card' }, h('h2', {}, name),
      h('table', { class: 'table checks' }, h('tbody', {}, cs.map((c) => h('tr', {},
        h('td', {}, h('span', { class: 'badge ' + (c.ok ? 'status-success' : c.required ? 'status-failed' : 'status-cancelled') }, c.ok ? 'ok' : c.required ? 'FAIL' : 'no')),
        h('td', { class: 'nowrap' }, c.name),
        h('td', {}, c.detail, !c.ok && c.fix ? h('div', { class: 'fix' }, 'Fix: ', c.fix) : null))))))),
    h('p', { class: 'muted small' }, 'corral doctor, run by the server at ', fmtTime(r.checked_at), '; checks are kept for a minute.'));
}
