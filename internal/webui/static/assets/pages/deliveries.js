// Deliveries: notifications to the host, dead letters first, with retry.

import { h, replace, errorBox, time, fmtTime } from '../dom.js';
import { api, get, APIError } from '../api.js';
import { navigate } from '../app.js';

const states = [['failed', 'Dead letters'], ['pending', 'Pending'], ['delivered', 'Delivered'], ['', 'All']];

export async function deliveriesPage(main, { signal, query }) {
  const state = query.has('state') ? query.get('state') : 'failed';
  const body = h('div');
  replace(main, h('header', { class: 'page-head' }, h('h1', {}, 'Deliveries')),
    h('p', { class: 'muted' }, 'Signed notifications to the host (notify.url): a failed one is retried with backoff, then kept here as a dead letter.'),
    h('div', { class: 'tabs', role: 'tablist' }, states.map(([s, label]) =>
      h('a', { class: 'tab', role: 'tab', href: '/deliveries?state=' + s, 'aria-selected': String(s === state) }, label))),
    body);
  let list;
  try {
    list = (await get('/api/deliveries?' + new URLSearchParams(state ? { state } : {}), { signal })).deliveries || [];
  } catch (ex) {
    if (ex instanceof APIError && ex.status === 501) {
      replace(body, h('p', { class: 'card empty' }, ex.message));
      return;
    }
    throw ex;
  }
  replace(body, h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
    h('thead', {}, h('tr', {}, ['State', 'Event', 'Task', 'Attempts', 'Last error', 'Created', ''].map((c) => h('th', {}, c)))),
    h('tbody', {}, list.length ? list.map((d) => {
      const retry = d.state === 'failed' ? h('button', { type: 'button', class: 'btn btn-small', onclick: async () => {
        retry.disabled = true;
        try {
          await api('POST', '/api/deliveries/' + encodeURIComponent(d.delivery_id) + '/retry', undefined, { signal });
          navigate(location.pathname + location.search, { replace: true });
        } catch (ex) { retry.replaceWith(errorBox(ex)); }
      } }, 'Retry') : null;
      return h('tr', {},
        h('td', {}, h('span', { class: 'badge delivery-' + d.state }, d.state)),
        h('td', { class: 'mono' }, d.event_type),
        h('td', { class: 'mono nowrap' }, d.task_id ? h('a', { href: '/tasks/' + encodeURIComponent(d.task_id) }, d.task_id) : ''),
        h('td', {}, String(d.attempts), d.next_attempt_at ? h('div', { class: 'muted small' }, 'next ' + fmtTime(d.next_attempt_at)) : null),
        h('td', { class: 'small' }, d.last_status_code ? `HTTP ${d.last_status_code} ` : '', d.last_error || ''),
        h('td', { class: 'nowrap' }, time(d.created_at)),
        h('td', {}, retry));
    }) : h('tr', {}, h('td', { colspan: 7, class: 'empty' }, 'None.'))))));
}
