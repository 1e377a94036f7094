// The app: a router over the page paths (each page has a link a person
// can share), the token prompt, and the live-update indicator.

import { h, replace, errorBox } from './dom.js';
import { onUnauthorized, setToken, forgetToken, token, get, APIError } from './api.js';
import { tasksPage } from './pages/tasks.js';
import { taskPage } from './pages/task.js';
import { spawnPage } from './pages/spawn.js';
import { workspacePage } from './pages/workspace.js';
import { sessionsPage, sessionPage } from './pages/sessions.js';
import { skillsPage, skillPage } from './pages/skills.js';
import { documentsPage } from './pages/documents.js';
import { deliveriesPage } from './pages/deliveries.js';
import { healthPage } from './pages/health.js';

// routes map a path pattern to a page; :name is one segment, *rest the rest.
const routes = [
  ['/', tasksPage, 'tasks'],
  ['/tasks', tasksPage, 'tasks'],
  ['/tasks/:id', taskPage, 'tasks'],
  ['/spawn', spawnPage, 'spawn'],
  ['/workspace', workspacePage, 'workspace'],
  ['/workspace/*rest', workspacePage, 'workspace'],
  ['/sessions', sessionsPage, 'sessions'],
  ['/sessions/:id', sessionPage, 'sessions'],
  ['/skills', skillsPage, 'skills'],
  ['/skills/:name', skillPage, 'skills'],
  ['/documents', documentsPage, 'documents'],
  ['/deliveries', deliveriesPage, 'deliveries'],
  ['/health', healthPage, 'health'],
];

function match(path) {
  const segs = path.split('/').filter(Boolean);
  for (const [pattern, page, section] of routes) {
    const ps = pattern.split('/').filter(Boolean);
    const params = {};
    let ok = true;
    for (let i = 0; i < ps.length && ok; i++) {
      if (ps[i].startsWith('*')) { params[ps[i].slice(1)] = segs.slice(i).map(decodeURIComponent).join('/'); return { page, section, params }; }
      if (i >= segs.length) ok = false;
      else if (ps[i].startsWith(':')) params[ps[i].slice(1)] = decodeURIComponent(segs[i]);
      else if (ps[i] !== segs[i]) ok = false;
    }
    if (ok && segs.length === ps.length) return { page, section, params };
  }
  return null;
}

const main = document.getElementById('main');
let current = null; // the page's AbortController

// render shows the page for the current location. Each page gets a
// signal that aborts when the user leaves it (its streams stop).
export function render() {
  if (current) current.abort();
  current = new AbortController();
  const m = match(location.pathname);
  for (const a of document.querySelectorAll('.nav a')) a.classList.toggle('active', !!m && a.dataset.section === m.section);
  if (!m) {
    replace(main, h('h1', {}, 'Not found'), h('p', {}, 'No page here. ', h('a', { href: '/tasks' }, 'Go to the tasks.')));
    return;
  }
  const ctx = { signal: current.signal, params: m.params, query: new URLSearchParams(location.search) };
  replace(main, h('p', { class: 'muted loading' }, 'Loading…'));
  Promise.resolve(m.page(main, ctx)).catch((err) => {
    if (ctx.signal.aborted) return;
    if (err instanceof APIError && err.status === 401) return; // the token dialog is open
    console.error(err);
    replace(main, h('h1', {}, 'Something went wrong'), errorBox(err));
  });
}

// navigate goes to path within the app, keeping history.
export function navigate(path, { replace: rep } = {}) {
  if (rep) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  render();
  window.scrollTo(0, 0);
}

// Links to the app's own pages change pages without a reload.
document.addEventListener('click', (e) => {
  const a = e.target.closest('a');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  if (a.target || a.hasAttribute('download')) return;
  const href = a.getAttribute('href');
  if (!href || href === '#') { if (href === '#') e.preventDefault(); return; }
  const u = new URL(a.href, location.href);
  if (u.origin !== location.origin || u.pathname.startsWith('/api/') || !match(u.pathname)) return;
  e.preventDefault();
  navigate(u.pathname + u.search);
});
window.addEventListener('popstate', render);

// The token: asked for once, when the server first answers 401.
const dialog = document.getElementById('token-dialog');
const forget = document.getElementById('forget-token');
const tokenError = document.getElementById('token-error');
onUnauthorized(() => {
  if (dialog.open) return;
  if (token()) {
    tokenError.textContent = 'The server refused the token. Enter it again.';
    tokenError.hidden = false;
  }
  forgetToken();
  forget.hidden = true;
  dialog.showModal();
  document.getElementById('token-input').focus();
});
document.getElementById('token-form').addEventListener('submit', () => {
  setToken(document.getElementById('token-input').value.trim());
  document.getElementById('token-input').value = '';
  tokenError.hidden = true;
  forget.hidden = false;
  askToken();
  render();
});
dialog.addEventListener('cancel', (e) => e.preventDefault());
forget.hidden = !token();
forget.addEventListener('click', () => {
  forgetToken();
  forget.hidden = true;
  askToken();
  render();
});

// setLive shows in the sidebar whether the server answers.
function setLive(state) {
  const el = document.getElementById('live');
  el.textContent = state;
  el.className = 'live live-' + state;
}

// checkServer asks the server's /healthz, for the sidebar's indicator to
// say on every page whether the server is up: live while it answers ok,
// reconnecting while it answers that it is starting or cannot reach its
// store, offline while it does not answer. A short request every few
// seconds, not a stream: the pages follow streams of their own, and a
// browser holds at most six connections to a server across all its tabs.
async function checkServer() {
  for (let attempt = 1; ; attempt++) {
    try {
      const r = await fetch('/healthz', { cache: 'no-store', credentials: 'omit' });
      setLive(r.ok ? 'live' : 'reconnecting');
      return;
    } catch {
      // Chromium aborts requests in flight when the host's network
      // changes (see boot.js): once more before saying offline.
      if (attempt > 1) { setLive('offline'); return; }
      await new Promise((res) => setTimeout(res, 300));
    }
  }
}

// askToken makes a server with a token ask for it at once, whatever the
// page: some pages (the spawn form) read nothing before the user acts.
function askToken() { get('/api/tasks?limit=1').catch(() => {}); }

checkServer();
setInterval(checkServer, 5000);
askToken();
render();
