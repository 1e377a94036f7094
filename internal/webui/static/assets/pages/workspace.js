// The workspace browser: shared/ (where files can be uploaded) and the
// named workspaces (read-only), each directory and file at its own link:
// /workspace/shared/PATH, /workspace/projects/NAME/PATH.

import { h, replace, fmtSize, time, errorBox, encodePath } from '../dom.js';
import { get, request } from '../api.js';
import { navigate } from '../app.js';
import { render as renderFile, fileBytes, download } from '../preview.js';

export async function workspacePage(main, { signal, params }) {
  const rest = params.rest || '';
  if (!rest) return navigate('/workspace/shared/', { replace: true });
  const [area, ...parts] = rest.split('/');
  let name = '';
  let path = parts.join('/');
  if (area === 'projects') { name = parts[0] || ''; path = parts.slice(1).join('/'); }
  else if (area !== 'shared') return navigate('/workspace/shared/', { replace: true });

  const apiBase = name ? '/api/workspaces/' + encodeURIComponent(name) + '/files/' : '/api/workspace/';
  const pageBase = name ? '/workspace/projects/' + encodeURIComponent(name) + '/' : '/workspace/shared/';
  const rootLabel = name ? 'projects/' + name : 'shared';

  const side = h('aside', { class: 'ws-side card' }, h('h2', {}, 'Workspaces'),
    h('ul', { class: 'plain ws-list' }, h('li', {}, h('a', { href: '/workspace/shared/', class: !name ? 'active' : '' }, 'shared/'))));
  const content = h('div', { class: 'ws-main' });
  replace(main, h('header', { class: 'page-head' }, h('h1', {}, 'Workspace')), h('div', { class: 'ws-layout' }, side, content));

  get('/api/workspaces', { signal }).then((r) => {
    for (const w of r.workspaces || []) {
      side.lastChild.append(h('li', {}, h('a', { href: '/workspace/projects/' + encodeURIComponent(w.name) + '/', class: w.name === name ? 'active' : '' }, 'projects/' + w.name),
        w.git ? h('span', { class: 'chip' }, 'git') : null));
    }
  }).catch(() => {});

  if (area === 'projects' && !name) {
    replace(content, h('p', { class: 'muted' }, 'Choose a workspace.'));
    return;
  }
  const crumbs = h('nav', { class: 'crumbs', 'aria-label': 'Path' }, h('a', { href: pageBase }, rootLabel));
  const segs = path.split('/').filter(Boolean);
  segs.forEach((seg, i) => {
    const to = segs.slice(0, i + 1).join('/');
    crumbs.append(' / ', i === segs.length - 1 ? h('span', {}, seg) : h('a', { href: pageBase + encodePath(to) + '/' }, seg));
  });

  const r = await get(apiBase + encodePath(path), { signal });
  if (r.entries) {
    const dir = path.replace(/\/$/, '');
    const table = h('div', { class: 'table-wrap' }, h('table', { class: 'table files-table' },
      h('thead', {}, h('tr', {}, ['Name', 'Size', 'Modified'].map((c) => h('th', {}, c)))),
      h('tbody', {}, r.entries.length ? r.entries.map((e) => {
        const base = e.path.split('/').pop();
        return h('tr', {},
          h('td', { class: 'mono' }, h('a', { href: pageBase + encodePath(e.path) + (e.is_dir ? '/' : '') }, e.is_dir ? base + '/' : base)),
          h('td', { class: 'nowrap' }, e.is_dir ? '' : fmtSize(e.size)),
          h('td', { class: 'nowrap' }, time(e.modified)));
      }) : h('tr', {}, h('td', { colspan: 3, class: 'empty' }, 'Empty directory.')))));
    replace(content, h('div', { class: 'toolbar' }, crumbs, h('div', { class: 'spacer' }), name ? h('span', { class: 'muted small' }, 'read-only') : uploader(dir, signal)), table);
    return;
  }
  // A file.
  const bytes = fileBytes(r);
  replace(content,
    h('div', { class: 'toolbar' }, crumbs, h('div', { class: 'spacer' }),
      h('span', { class: 'muted small' }, `${r.type} · ${fmtSize(r.size)}`),
      h('button', { type: 'button', class: 'btn btn-small', onclick: () => download(r.path, bytes), disabled: r.truncated, title: r.truncated ? 'Only the start of the file was read' : '' }, 'Download')),
    h('div', { class: 'card file-view' }, renderFile({ name: r.path, type: r.type, size: r.size, bytes, truncated: r.truncated })));
}

// uploader writes chosen or dropped files into dir of shared/
// (PUT /api/workspace/PATH) and reloads the listing.
function uploader(dir, signal) {
  const input = h('input', { type: 'file', multiple: true, class: 'visually-hidden', id: 'ws-upload' });
  const status = h('span', { class: 'muted small', role: 'status' });
  async function put(files) {
    for (const f of files) {
      status.textContent = 'Uploading ' + f.name + '…';
      try {
        await request('PUT', '/api/workspace/' + encodePath((dir ? dir + '/' : '') + f.name), { body: f, signal });
      } catch (ex) {
        status.replaceWith(errorBox(ex));
        return;
      }
    }
    navigate(location.pathname, { replace: true });
  }
  input.addEventListener('change', () => put([...input.files]));
  const label = h('label', { class: 'btn btn-small btn-primary', for: 'ws-upload' }, 'Upload to shared/' + (dir ? dir + '/' : ''));
  const zone = h('span', { class: 'upload' }, status, label, input);
  const main = document.getElementById('main');
  const over = (e) => { if (e.dataTransfer && [...e.dataTransfer.types].includes('Files')) { e.preventDefault(); main.classList.add('drop-over'); } };
  const leave = () => main.classList.remove('drop-over');
  const drop = (e) => { if (!e.dataTransfer || !e.dataTransfer.files.length) return; e.preventDefault(); leave(); put([...e.dataTransfer.files]); };
  main.addEventListener('dragover', over);
  main.addEventListener('dragleave', leave);
  main.addEventListener('drop', drop);
  signal.addEventListener('abort', () => { main.removeEventListener('dragover', over); main.removeEventListener('dragleave', leave); main.removeEventListener('drop', drop); leave(); });
  return zone;
}
