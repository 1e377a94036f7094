// Spawning work: spawn_worker (POST /api/tasks), spawn_workspace_task and
// code_execute (POST /api/exec), with context files picked from shared/
// and attachments dropped on the form.

import { h, replace, field, select, errorBox, parseLabels, fmtSize, encodePath } from '../dom.js';
import { api, get, request } from '../api.js';
import { navigate } from '../app.js';
import { download } from '../preview.js';

const agents = [['', 'server default'], 'claude', 'gemini', 'codex', 'opencode', 'command'];
const runtimes = [['', 'server default'], 'local', 'gvisor', 'docker'];
const networks = [['', 'server default'], 'none', 'allowlist', 'open'];

export async function spawnPage(main, { signal, query }) {
  const kinds = { worker: 'Worker task', workspace: 'Workspace task', exec: 'Run code' };
  const kind = kinds[query.get('kind')] ? query.get('kind') : 'worker';
  const body = h('div');
  replace(main,
    h('header', { class: 'page-head' }, h('h1', {}, 'New task')),
    h('div', { class: 'tabs', role: 'tablist' }, Object.entries(kinds).map(([k, label]) =>
      h('a', { class: 'tab', role: 'tab', href: '/spawn?kind=' + k, 'aria-selected': String(k === kind) }, label))),
    body);
  if (kind === 'worker') body.append(workerForm(signal, query));
  else if (kind === 'workspace') body.append(await workspaceForm(signal));
  else body.append(execForm(signal));
}

// text, number: small input makers.
const text = (name, attrs = {}) => h('input', { type: 'text', name, ...attrs });
const number = (name, attrs = {}) => h('input', { type: 'number', name, ...attrs });

// commandArgv turns the command field into an argv: sh -c with the text.
const commandArgv = (s) => (s.trim() ? ['sh', '-c', s] : undefined);

function workerForm(signal, query) {
  const f = {
    desc: h('textarea', { name: 'task_description', rows: 5, required: true, placeholder: 'What should the agent do? E.g. “Chart my spending by category from statement.csv”.' }),
    agent: select('agent', agents, query.get('agent') || ''),
    command: text('command', { placeholder: "e.g. python3 context/analyse.py > output/report.md", class: 'mono' }),
    model: text('model', { placeholder: 'the agent\'s default' }),
    runtime: select('runtime', runtimes, ''),
    image: text('image', { placeholder: 'for docker, e.g. python:3.12-slim' }),
    network: select('network', networks, ''),
    memory: text('memory_limit', { placeholder: 'e.g. 2Gi' }),
    cpu: text('cpu_limit', { placeholder: 'e.g. 2 or 500m' }),
    pids: number('pids_limit', { min: 8, placeholder: 'e.g. 512' }),
    timeout: number('timeout_minutes', { min: 1, placeholder: 'server default' }),
    labels: text('labels', { placeholder: 'team=data, ticket=42' }),
    conversation: text('conversation_id', { placeholder: 'optional' }),
    save: h('input', { type: 'checkbox', name: 'save_to_shared' }),
  };
  const commandField = field('Command (run with sh -c in the task directory; the description is its stdin)', f.command);
  const syncAgent = () => { commandField.hidden = f.agent.value !== 'command'; };
  f.agent.addEventListener('change', syncAgent);
  syncAgent();
  const context = contextPicker(signal);
  const attachments = attachmentDrop(signal);
  const err = h('div');
  const submit = h('button', { class: 'btn btn-primary', type: 'submit' }, 'Spawn task');
  return h('form', { class: 'form card', id: 'spawn-worker', onsubmit: async (e) => {
    e.preventDefault();
    err.replaceChildren();
    try {
      const req = { task_description: f.desc.value };
      const put = (k, v) => { if (v !== undefined && v !== '' && v !== null) req[k] = v; };
      put('agent', f.agent.value);
      if (f.agent.value === 'command') put('command', commandArgv(f.command.value));
      put('model', f.model.value.trim());
      put('runtime', f.runtime.value);
      put('image', f.image.value.trim());
      put('network', f.network.value);
      put('timeout_minutes', f.timeout.value ? Number(f.timeout.value) : undefined);
      const res = {};
      if (f.memory.value.trim()) res.memory_limit = f.memory.value.trim();
      if (f.cpu.value.trim()) res.cpu_limit = f.cpu.value.trim();
      if (f.pids.value) res.pids_limit = Number(f.pids.value);
      if (Object.keys(res).length) req.resources = res;
      const labels = parseLabels(f.labels.value);
      if (Object.keys(labels).length) req.labels = labels;
      put('conversation_id', f.conversation.value.trim());
      if (f.save.checked) req.save_to_shared = true;
      if (context.value().length) req.context_files = context.value();
      if (attachments.pending()) throw new Error('Wait for the attachments to finish uploading.');
      if (attachments.value().length) req.attachment_ids = attachments.value();
      submit.disabled = true;
      const r = await api('POST', '/api/tasks', req, { signal });
      navigate('/tasks/' + encodeURIComponent(r.task_id));
    } catch (ex) {
      submit.disabled = false;
      replace(err, errorBox(ex));
    }
  } },
  field('Description', f.desc),
  h('div', { class: 'grid-3' }, field('Agent', f.agent), field('Model', f.model), field('Timeout (minutes)', f.timeout)),
  commandField,
  h('div', { class: 'grid-3' }, field('Runtime', f.runtime), field('Image', f.image), field('Network', f.network)),
  h('div', { class: 'grid-3' }, field('Memory', f.memory), field('CPU', f.cpu), field('Processes', f.pids)),
  h('div', { class: 'grid-2' }, field('Labels', f.labels), field('Conversation', f.conversation)),
  h('div', { class: 'grid-2' }, context.el, attachments.el),
  h('label', { class: 'check' }, f.save, ' Save the outputs to shared/ when the task succeeds'),
  err,
  h('div', { class: 'actions' }, submit));
}

async function workspaceForm(signal) {
  let names = [];
  try { names = ((await get('/api/workspaces', { signal })).workspaces || []).map((w) => w.name); } catch { /* none listed */ }
  const list = h('datalist', { id: 'workspace-names' }, names.map((n) => h('option', { value: n })));
  const f = {
    ws: text('workspace_path', { required: true, list: 'workspace-names', placeholder: 'a name: lowercase letters, digits, . _ -' }),
    desc: text('task_description', { required: true, placeholder: 'A short description' }),
    query: h('textarea', { name: 'query', rows: 5, required: true, placeholder: 'The detailed instructions' }),
    context: h('textarea', { name: 'context', rows: 2, placeholder: 'Context from the conversation (optional)' }),
    git: h('input', { type: 'checkbox', name: 'init_git' }),
    agent: select('agent', agents, ''),
    command: text('command', { class: 'mono', placeholder: 'for the command agent' }),
    model: text('model'),
    conversation: text('conversation_id', { placeholder: 'reported back to when it ends' }),
  };
  const err = h('div');
  return h('form', { class: 'form card', id: 'spawn-workspace', onsubmit: async (e) => {
    e.preventDefault();
    try {
      const args = { workspace_path: f.ws.value.trim(), task_description: f.desc.value, query: f.query.value };
      if (f.context.value.trim()) args.context = f.context.value;
      if (f.git.checked) args.init_git = true;
      if (f.agent.value) args.agent = f.agent.value;
      if (f.agent.value === 'command' && commandArgv(f.command.value)) args.command = commandArgv(f.command.value);
      if (f.model.value.trim()) args.model = f.model.value.trim();
      if (f.conversation.value.trim()) args.conversation_id = f.conversation.value.trim();
      const r = await api('POST', '/api/tools/spawn_workspace_task', args, { signal });
      navigate('/tasks/' + encodeURIComponent(r.task_id));
    } catch (ex) { replace(err, errorBox(ex)); }
  } },
  h('p', { class: 'muted' }, 'An agent works in a named workspace (projects/NAME), created if it does not exist; tasks on one workspace run one after another.'),
  list,
  h('div', { class: 'grid-2' }, field('Workspace', f.ws), field('Description', f.desc)),
  field('Instructions', f.query), field('Context', f.context),
  h('div', { class: 'grid-3' }, field('Agent', f.agent), field('Model', f.model), field('Conversation', f.conversation)),
  field('Command (sh -c, for the command agent)', f.command),
  h('label', { class: 'check' }, f.git, ' Start a git repository if the workspace is new'),
  err, h('div', { class: 'actions' }, h('button', { class: 'btn btn-primary', type: 'submit' }, 'Spawn workspace task')));
}

function execForm(signal) {
  const f = {
    command: h('textarea', { name: 'command', rows: 4, required: true, class: 'mono', placeholder: 'ls -la /workspace/input && python3 -c "print(1+1)"' }),
    runtime: select('runtime', runtimes, ''),
    image: text('image', { placeholder: 'for docker' }),
    timeout: number('timeout_seconds', { min: 1, max: 300, placeholder: 'server default' }),
    network: h('input', { type: 'checkbox', name: 'network' }),
  };
  const context = contextPicker(signal);
  const attachments = attachmentDrop(signal);
  const out = h('div');
  const err = h('div');
  const submit = h('button', { class: 'btn btn-primary', type: 'submit' }, 'Run');
  return h('div', {}, h('form', { class: 'form card', id: 'spawn-exec', onsubmit: async (e) => {
    e.preventDefault();
    err.replaceChildren();
    try {
      const req = { command: f.command.value };
      if (f.runtime.value) req.runtime = f.runtime.value;
      if (f.image.value.trim()) req.image = f.image.value.trim();
      if (f.timeout.value) req.timeout_seconds = Number(f.timeout.value);
      if (f.network.checked) req.network = true;
      if (context.value().length) req.context_files = context.value();
      if (attachments.pending()) throw new Error('Wait for the attachments to finish uploading.');
      if (attachments.value().length) req.attachment_ids = attachments.value();
      submit.disabled = true;
      replace(out, h('p', { class: 'muted' }, 'Running…'));
      const r = await api('POST', '/api/exec', req, { signal });
      replace(out, execResult(r, signal));
    } catch (ex) {
      out.replaceChildren();
      replace(err, errorBox(ex));
    } finally { submit.disabled = false; }
  } },
  h('p', { class: 'muted' }, 'code_execute: one shell command in a fresh sandbox. Inputs are in /workspace/input/; files written to /workspace/output/ come back as attachments.'),
  field('Command (sh -c)', f.command),
  h('div', { class: 'grid-3' }, field('Runtime', f.runtime), field('Image', f.image), field('Timeout (seconds)', f.timeout)),
  h('div', { class: 'grid-2' }, context.el, attachments.el),
  h('label', { class: 'check' }, f.network, ' Network through the egress proxy'),
  err, h('div', { class: 'actions' }, submit)), out);
}

function execResult(r, signal) {
  return h('section', { class: 'card' },
    h('div', { class: 'title-row' }, h('span', { class: 'badge status-' + (r.success ? 'success' : 'failed') }, r.success ? 'success' : 'failed'),
      h('h2', {}, 'Exit code ', r.exit_code == null ? '—' : String(r.exit_code)), h('div', { class: 'spacer' }),
      h('a', { href: '/tasks/' + encodeURIComponent(r.task_id) }, 'Task ' + r.task_id)),
    r.error ? h('div', { class: 'alert alert-error' }, r.error) : null,
    h('h3', {}, 'stdout'), h('pre', { class: 'code log' }, r.stdout || ''),
    r.stderr ? [h('h3', {}, 'stderr'), h('pre', { class: 'code log stderr' }, r.stderr)] : null,
    (r.output_files || []).length ? [h('h3', {}, 'Output files'), h('ul', { class: 'plain' }, r.output_files.map((f) => h('li', {},
      h('span', { class: 'mono' }, f.name), ' ', h('span', { class: 'muted' }, fmtSize(f.size) + ' · ' + f.type), ' ',
      f.attachment_id ? h('button', { type: 'button', class: 'btn btn-small btn-ghost', onclick: async () => {
        const res = await request('GET', '/api/attachments/' + encodeURIComponent(f.attachment_id), { signal });
        download(f.name, await res.arrayBuffer());
      } }, 'Download') : h('span', { class: 'muted' }, f.note || ''))))] : null);
}

// contextPicker chooses files of shared/ to copy into the task's context/:
// a browser of shared/ with a checkbox per file.
export function contextPicker(signal) {
  const chosen = new Set();
  const chips = h('div', { class: 'chips' });
  const tree = h('div', { class: 'picker', hidden: true });
  const drawChips = () => replace(chips, [...chosen].map((p) => h('span', { class: 'chip' }, p,
    h('button', { type: 'button', class: 'chip-x', 'aria-label': 'Remove ' + p, onclick: () => { chosen.delete(p); drawChips(); } }, '×'))));
  async function open(dir) {
    replace(tree, h('p', { class: 'muted' }, 'Loading…'));
    try {
      const r = await get('/api/workspace/' + encodePath(dir), { signal });
      const up = dir ? dir.split('/').slice(0, -1).join('/') : null;
      replace(tree, h('div', { class: 'picker-path mono' }, 'shared/' + dir),
        h('ul', { class: 'plain' },
          up !== null ? h('li', {}, h('button', { type: 'button', class: 'linkish', onclick: () => open(up) }, '↑ ..')) : null,
          (r.entries || []).map((e) => h('li', {}, e.is_dir
            ? h('button', { type: 'button', class: 'linkish', onclick: () => open(e.path) }, e.path.split('/').pop() + '/')
            : h('label', { class: 'check' }, h('input', { type: 'checkbox', checked: chosen.has(e.path), onchange: (ev) => {
              if (ev.target.checked) chosen.add(e.path); else chosen.delete(e.path);
              drawChips();
            } }), ' ', e.path.split('/').pop(), ' ', h('span', { class: 'muted small' }, fmtSize(e.size)))))));
    } catch (ex) { replace(tree, errorBox(ex)); }
  }
  const toggle = h('button', { type: 'button', class: 'btn btn-small', onclick: () => {
    tree.hidden = !tree.hidden;
    if (!tree.hidden) open('');
  } }, 'Pick from shared/');
  const el = h('div', { class: 'field' }, h('span', { class: 'field-label' }, 'Context files'),
    h('div', {}, toggle), chips, tree, h('span', { class: 'hint' }, 'Copied into the task\'s context/.'));
  return { el, value: () => [...chosen] };
}

// attachmentDrop uploads files dropped on it (or chosen) as attachments
// (POST /api/attachments) and holds their ids.
export function attachmentDrop(signal) {
  const ids = [];
  let uploading = 0;
  const list = h('ul', { class: 'plain uploads' });
  const input = h('input', { type: 'file', multiple: true, class: 'visually-hidden', id: 'attach-' + Math.random().toString(36).slice(2) });
  const zone = h('label', { class: 'dropzone', for: input.id }, h('strong', {}, 'Drop files here'), ' or click to choose');
  async function upload(files) {
    for (const file of files) {
      const item = h('li', {}, h('span', { class: 'mono' }, file.name), ' ', h('span', { class: 'muted' }, fmtSize(file.size) + ' · uploading…'));
      list.append(item);
      uploading++;
      try {
        const form = new FormData();
        form.append('file', file, file.name);
        const r = await api('POST', '/api/attachments', form, { signal });
        ids.push(r.attachment_id);
        item.lastChild.textContent = fmtSize(file.size) + ' · attached';
        item.dataset.attachmentId = r.attachment_id;
        item.classList.add('uploaded');
      } catch (ex) {
        item.append(errorBox(ex));
      } finally { uploading--; }
    }
  }
  input.addEventListener('change', () => { upload([...input.files]); input.value = ''; });
  zone.addEventListener('dragover', (e) => { e.preventDefault(); zone.classList.add('over'); });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (e) => { e.preventDefault(); zone.classList.remove('over'); upload([...e.dataTransfer.files]); });
  const el = h('div', { class: 'field' }, h('span', { class: 'field-label' }, 'Attachments'), zone, input, list,
    h('span', { class: 'hint' }, 'Copied into the task\'s context/ under their names.'));
  return { el, value: () => ids, pending: () => uploading > 0 };
}
