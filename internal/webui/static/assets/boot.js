// The page's entry: it imports the app and, if a module of it fails to
// load, loads the page again.
//
// Chromium aborts every request in flight when the host's network changes
// (net::ERR_NETWORK_CHANGED: an interface comes or goes, as when a
// container starts on this host), loopback included. One module of the
// app that fails to load leaves the whole app unrun — an empty page — and
// the document keeps that failure for its life, so only a new document
// can load it. The page reloads at most twice in a row; then, or for an
// error the app throws while it runs, the error is thrown for the console
// to show.

const key = 'corral.bootReloads';
const reloads = Number(sessionStorage.getItem(key) || 0);

import('./app.js').then(() => sessionStorage.removeItem(key), (err) => {
  if (reloads < 2) {
    sessionStorage.setItem(key, String(reloads + 1));
    console.warn('the app did not load; loading the page again:', err.message);
    location.reload();
    return;
  }
  sessionStorage.removeItem(key);
  throw err;
});
