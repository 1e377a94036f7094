// Documents and notes: ranked search (the query is in the URL), and a form
// to push a note.

import { h, replace, field, select, errorBox, fmtSize, time } from '../dom.js';
import { api, get } from '../api.js';
import { navigate } from '../app.js';
import { inline } from '../markdown.js';

export async function documentsPage(main, { signal, query }) {
  const q = query.get('q') || '';
  const type = query.get('type') || '';
  const input = h('input', { type: 'search', name: 'q', value: q, placeholder: 'Search documents and notes', 'aria-label': 'Search' });
  const kind = select('type', [['', 'documents and notes'], ['document', 'documents'], ['note', 'notes']], type);
  const results = h('div');
  const search = h('form', { class: 'filters', role: 'search', onsubmit: (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    if (input.value.trim()) p.set('q', input.value.trim());
    if (kind.value) p.set('type', kind.value);
    navigate('/documents' + (p.toString() ? '?' + p : ''));
  } }, input, kind, h('button', { class: 'btn btn-primary', type: 'submit' }, 'Search'));

  const title = h('input', { type: 'text', name: 'title', required: true });
  const content = h('textarea', { name: 'content', rows: 5, required: true, placeholder: 'Markdown' });
  const noteErr = h('div');
  const note = h('details', { class: 'card' }, h('summary', {}, 'New note'),
    h('form', { class: 'form', onsubmit: async (e) => {
      e.preventDefault();
      try {
        const d = await api('POST', '/api/documents', { title: title.value, content: content.value }, { signal });
        navigate('/documents?q=' + encodeURIComponent(d.title));
      } catch (ex) { replace(noteErr, errorBox(ex)); }
    } }, field('Title', title), field('Content', content), noteErr,
    h('div', { class: 'actions' }, h('button', { class: 'btn btn-primary', type: 'submit' }, 'Save note'))));

  replace(main, h('header', { class: 'page-head' }, h('h1', {}, 'Documents and notes')), search, results, note);
  if (!q) {
    replace(results, h('p', { class: 'muted' }, 'Search by words: every word counts, documents with more of them rank higher.'));
    return;
  }
  try {
    const p = new URLSearchParams({ q });
    if (type) p.set('type', type);
    const r = await get('/api/documents?' + p, { signal });
    const docs = r.documents || [];
    replace(results, docs.length ? h('ol', { class: 'plain results' }, docs.map((d) => h('li', { class: 'card result-item' },
      h('div', { class: 'title-row' }, h('span', { class: 'chip' }, d.source_type), h('h2', {}, d.title)),
      d.snippet ? h('p', { class: 'snippet' }, inline(d.snippet)) : null,
      h('div', { class: 'muted small' }, h('span', { class: 'mono' }, d.document_id), ' · ', d.name || '', ' · ', fmtSize(d.size), ' · ', time(d.created_at),
        d.source ? [' · from ', h('span', { class: 'mono' }, d.source)] : null,
        d.indexed ? null : [' · ', d.index_note || 'text not indexed'])))) : h('p', { class: 'empty card' }, 'Nothing matches.'));
  } catch (ex) { replace(results, errorBox(ex)); }
}
