'use strict';
// The one-time token is in the fragment (never sent to a server); post it once, then drop it
// from the address bar and the history.
(async () => {
  const out = document.getElementById('login-status');
  const token = location.hash.slice(1);
  history.replaceState(null, '', '/ui/login');
  if (!token) {
    out.textContent = 'No login token in this link. Run `weft dashboard` on the gateway\'s host and open the link it prints.';
    return;
  }
  try {
    const r = await fetch('/ui/login', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ token }),
    });
    const v = await r.json().catch(() => ({}));
    if (!r.ok) {
      out.textContent = 'Login refused: ' + (v.error || r.status);
      return;
    }
    location.replace('/ui/');
  } catch (e) {
    out.textContent = 'Login failed: ' + e;
  }
})();
