// Previews of files a worker or a person wrote: images inline (PNG, JPEG,
// GIF and WebP only, from blob: URLs made of bytes fetched with the token),
// Markdown rendered, CSV as a table, text coloured; SVG and HTML only ever
// as their source text, everything else as a download. All of it is
// untrusted: names and contents reach the page as text nodes only.

import { h, fmtSize } from './dom.js';
import { renderMarkdown } from './markdown.js';
import { highlight, languageOf } from './highlight.js';

// Types shown as images. SVG is not among them: it can carry script.
export const imageTypes = new Set(['image/png', 'image/jpeg', 'image/gif', 'image/webp']);

const maxPreviewBytes = 2 << 20;
const maxCSVRows = 1000;

export function baseType(t) { return String(t || '').split(';')[0].trim().toLowerCase(); }

// kindOf says how a file is shown: image, markdown, csv, text or binary.
export function kindOf(name, type) {
  const t = baseType(type);
  const ext = String(name).toLowerCase().split('.').pop();
  if (imageTypes.has(t)) return 'image';
  if (t === 'text/markdown' || ext === 'md' || ext === 'markdown') return 'markdown';
  if (t === 'text/csv' || t === 'text/tab-separated-values' || ext === 'csv' || ext === 'tsv') return 'csv';
  if (t.startsWith('text/') || t === 'image/svg+xml' || /^application\/(json|jsonl|x-ndjson|yaml|toml|xml|javascript|x-sh)$/.test(t) || languageOf(name)) return 'text';
  return 'binary';
}

// objectURL makes a blob: URL of bytes as type, revoked once an image has
// loaded (the decoded picture stays on screen).
function imageURL(bytes, type) {
  return URL.createObjectURL(new Blob([bytes], { type }));
}

// download saves bytes under name. The blob is typed
// application/octet-stream so that it is always saved, never opened as a
// document of this origin.
export function download(name, bytes) {
  const url = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
  const a = document.createElement('a');
  a.href = url;
  a.download = String(name).split('/').pop() || 'download';
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// image shows bytes as an <img> if type is a safe image type.
export function image(bytes, type, alt) {
  const t = baseType(type);
  if (!imageTypes.has(t)) return h('p', { class: 'muted' }, 'Not shown: only PNG, JPEG, GIF and WebP images are displayed.');
  const img = h('img', { alt: alt || '', class: 'preview-image' });
  const url = imageURL(bytes, t);
  const done = () => URL.revokeObjectURL(url);
  img.addEventListener('load', done, { once: true });
  img.addEventListener('error', () => { done(); img.replaceWith(h('p', { class: 'muted' }, 'This file does not decode as an image.')); }, { once: true });
  img.src = url;
  return img;
}

// parseCSV reads RFC 4180 CSV (or TSV with sep '\t') into rows of cells.
export function parseCSV(text, sep = ',') {
  const rows = [];
  let row = [];
  let cell = '';
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"') {
        if (text[i + 1] === '"') { cell += '"'; i++; } else quoted = false;
      } else cell += c;
    } else if (c === '"' && cell === '') quoted = true;
    else if (c === sep) { row.push(cell); cell = ''; }
    else if (c === '\n' || c === '\r') {
      if (c === '\r' && text[i + 1] === '\n') i++;
      row.push(cell); rows.push(row); row = []; cell = '';
      if (rows.length > maxCSVRows) break;
    } else cell += c;
  }
  if (cell !== '' || row.length) { row.push(cell); rows.push(row); }
  return rows;
}

export function csvTable(text, tsv) {
  const rows = parseCSV(text, tsv ? '\t' : ',');
  if (!rows.length) return h('p', { class: 'muted' }, 'Empty file.');
  const [head, ...body] = rows;
  const shown = body.slice(0, maxCSVRows);
  return h('div', {},
    h('div', { class: 'table-wrap csv' }, h('table', { class: 'table table-compact' },
      h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))),
      h('tbody', {}, shown.map((r) => h('tr', {}, r.map((c) => h('td', {}, c))))))),
    body.length > shown.length || rows.length > maxCSVRows ? h('p', { class: 'muted' }, `First ${shown.length} rows shown.`) : null);
}

// codeBlock is text, coloured by the language its name implies.
export function codeBlock(text, name) {
  return h('pre', { class: 'code' }, highlight(text, name));
}

// render shows a file's bytes by kind. truncated says the bytes are only
// its start.
export function render({ name, type, size, bytes, truncated }) {
  const kind = kindOf(name, type);
  const note = truncated ? h('p', { class: 'muted' }, 'Only the start of the file is shown.') : null;
  if (kind === 'image') return image(bytes, type, name);
  if (kind === 'binary') return h('p', { class: 'muted' }, `No preview for ${baseType(type) || 'this type'} (${fmtSize(size ?? bytes.byteLength)}); download it.`);
  if ((size ?? bytes.byteLength) > maxPreviewBytes && !truncated) return h('p', { class: 'muted' }, `Too large to preview (${fmtSize(size)}); download it.`);
  const text = new TextDecoder().decode(bytes);
  if (kind === 'markdown') return h('div', {}, note, renderMarkdown(text));
  if (kind === 'csv') return h('div', {}, note, csvTable(text, baseType(type) === 'text/tab-separated-values' || /\.tsv$/i.test(name)));
  const lang = baseType(type) === 'image/svg+xml' ? 'svg' : name;
  return h('div', {}, note,
    baseType(type) === 'image/svg+xml' || baseType(type) === 'text/html' ? h('p', { class: 'muted' }, 'SVG and HTML files are shown as source, never rendered.') : null,
    codeBlock(text, lang));
}

// fileBytes turns the API's File answer (utf-8 or base64 content) into bytes.
export function fileBytes(f) {
  if (f.encoding === 'base64') {
    const bin = atob(f.content);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  return new TextEncoder().encode(f.content);
}
