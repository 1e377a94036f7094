// Skills: shared/skills/<name>/SKILL.md, listed and shown.

import { h, replace, fmtSize, time } from '../dom.js';
import { get } from '../api.js';
import { renderMarkdown } from '../markdown.js';

export async function skillsPage(main, { signal }) {
  const skills = (await get('/api/skills', { signal })).skills || [];
  replace(main, h('header', { class: 'page-head' }, h('h1', {}, 'Skills'), h('span', { class: 'muted' }, String(skills.length))),
    h('p', { class: 'muted' }, 'Workers read these from /workspace/shared/skills/; prompt.md lists each with its description.'),
    skills.length ? h('div', { class: 'cards' }, skills.map((s) => h('a', { class: 'card skill-card', href: '/skills/' + encodeURIComponent(s.name) },
      h('h2', { class: 'mono' }, s.name),
      s.error ? h('p', { class: 'alert alert-error' }, s.error) : h('p', {}, s.description || ''),
      s.docker_image ? h('span', { class: 'chip' }, s.docker_image) : null)))
      : h('p', { class: 'empty card' }, 'No skills yet. Create one with create_skill, POST /api/skills or corral skills create.'));
}

export async function skillPage(main, { signal, params }) {
  const s = await get('/api/skills/' + encodeURIComponent(params.name), { signal });
  // The frontmatter is shown as fields; the rest as Markdown.
  const body = String(s.content || '').replace(/^---\n[\s\S]*?\n---\n?/, '');
  replace(main, h('header', { class: 'page-head' }, h('h1', { class: 'mono' }, s.name), h('div', { class: 'spacer' }), h('a', { class: 'btn', href: '/workspace/shared/skills/' + encodeURIComponent(s.name) + '/' }, 'Browse its files')),
    h('section', { class: 'card meta' }, h('dl', { class: 'meta-grid' },
      h('dt', {}, 'Description'), h('dd', {}, s.description || ''),
      s.docker_image ? [h('dt', {}, 'Image'), h('dd', {}, s.docker_image)] : null,
      (s.dependencies || []).length ? [h('dt', {}, 'Dependencies'), h('dd', {}, s.dependencies.join(', '))] : null,
      h('dt', {}, 'Path'), h('dd', { class: 'mono' }, 'shared/' + s.path))),
    h('section', { class: 'card' }, renderMarkdown(body)),
    h('section', { class: 'card' }, h('h2', {}, 'Files'), h('table', { class: 'table table-compact' },
      h('tbody', {}, (s.files || []).map((f) => h('tr', {},
        h('td', { class: 'mono' }, h('a', { href: '/workspace/shared/skills/' + encodeURIComponent(s.name) + '/' + f.path.split('/').map(encodeURIComponent).join('/') }, f.path)),
        h('td', {}, f.is_dir ? '' : fmtSize(f.size)), h('td', {}, time(f.modified))))))));
}
