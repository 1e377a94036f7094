// DOM helpers. Every string given to h() becomes a text node or an
// attribute value, never markup: worker text (names, summaries,
// transcripts) cannot become elements. The app never parses HTML from a
// string, and the page's Trusted Types policy would refuse it if it did.

// h makes an element: h('a', {href: '/tasks', class: 'x'}, 'text', child).
// Attributes named on* add listeners; href goes through safeHref; style
// is refused (the CSP allows no inline style).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'href') el.setAttribute('href', safeHref(v));
    else if (k === 'style') throw new Error('inline styles are not allowed');
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value' || k === 'checked') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

// append adds children (strings, nodes, arrays of them; null skipped).
export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// clear empties an element and fills it with children.
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// safeHref keeps http(s) and mailto links (relative ones resolve to this
// origin) and turns anything else (javascript:, data:, vbscript:) into '#'.
export function safeHref(v) {
  try {
    const u = new URL(String(v), location.origin);
    if (u.protocol === 'http:' || u.protocol === 'https:' || u.protocol === 'mailto:') return u.href;
  } catch { /* not a URL */ }
  return '#';
}

// Dates and sizes, for people.
export function fmtSize(n) {
  if (n == null) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(v) : v.toFixed(v < 10 ? 1 : 0)) + ' ' + units[i];
}

export function fmtDuration(ms) {
  if (ms == null || ms < 0) return '';
  if (ms < 1000) return (ms / 1000).toFixed(1) + 's';
  const s = Math.round(ms / 1000);
  if (s < 60) return s + 's';
  const m = Math.floor(s / 60);
  if (m < 60) return m + 'm ' + String(s % 60).padStart(2, '0') + 's';
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + 'h ' + String(m % 60).padStart(2, '0') + 'm';
  return Math.floor(hr / 24) + 'd ' + (hr % 24) + 'h';
}

export function fmtAge(iso) {
  if (!iso) return '';
  const ms = Date.now() - Date.parse(iso);
  if (ms < 5000) return 'just now';
  return fmtDuration(ms).split(' ')[0] + ' ago';
}

export function fmtTime(iso) {
  if (!iso) return '';
  return new Date(iso).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
}

// fmtShort is a date without the year when it is this year's.
export function fmtShort(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  const opts = { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false };
  if (d.getFullYear() !== new Date().getFullYear()) opts.year = 'numeric';
  return d.toLocaleString(undefined, opts);
}

// time is a <time> element that says its full date on hover.
export function time(iso, text) {
  return h('time', { datetime: iso, title: fmtTime(iso) }, text ?? fmtAge(iso));
}

// statusBadge is a task's or a session's status, coloured by class.
export function statusBadge(status) {
  return h('span', { class: 'badge status-' + String(status).replace(/[^a-z_]/g, '') }, status);
}

// firstLine is the first non-empty line of s, cut at n characters.
export function firstLine(s, n = 120) {
  const line = String(s || '').split('\n').map((l) => l.trim()).find((l) => l) || '';
  return line.length > n ? line.slice(0, n - 1) + '…' : line;
}

// field is a labelled form control.
export function field(label, control, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), control, hint && h('span', { class: 'hint' }, hint));
}

// select makes a <select> of [value, label] pairs (or plain values).
export function select(name, options, value) {
  return h('select', { name }, options.map((o) => {
    const [v, l] = Array.isArray(o) ? o : [o, o];
    return h('option', { value: v, selected: v === value }, l);
  }));
}

// errorBox shows an API error: its message and each field's.
export function errorBox(err) {
  const fields = err && err.fields;
  return h('div', { class: 'alert alert-error', role: 'alert' },
    h('strong', {}, err && err.message ? err.message : String(err)),
    fields && fields.length ? h('ul', {}, fields.map((f) => h('li', {}, h('code', {}, f.field), ': ', f.message))) : null);
}

// copyButton copies text to the clipboard.
export function copyButton(text, label = 'Copy') {
  const b = h('button', { type: 'button', class: 'btn btn-small btn-ghost', title: 'Copy to the clipboard' }, label);
  b.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(text);
      b.textContent = 'Copied';
    } catch {
      b.textContent = 'Copy failed';
    }
    setTimeout(() => { b.textContent = label; }, 1500);
  });
  return b;
}

// labelChips shows a map of labels as key=value chips.
export function labelChips(labels) {
  const entries = Object.entries(labels || {});
  if (!entries.length) return null;
  return h('span', { class: 'chips' }, entries.map(([k, v]) => h('span', { class: 'chip' }, k + '=' + v)));
}

// parseLabels reads "k=v, k2=v2" into a map; problems throw.
export function parseLabels(s) {
  const out = {};
  for (const part of String(s || '').split(',').map((p) => p.trim()).filter(Boolean)) {
    const i = part.indexOf('=');
    if (i <= 0) throw new Error(`label "${part}" is not key=value`);
    out[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return out;
}

// encodePath escapes each segment of a slash-separated path for a URL.
export function encodePath(p) {
  return String(p).split('/').map(encodeURIComponent).join('/');
}
