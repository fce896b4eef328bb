// The demo's user picker: sign in as any user. Only `gpu-booking demo` answers
// /demo/sign-in (it mints a token with its own per-run secret); everywhere else the
// request fails and the picker stays hidden. The token goes through the page's own
// "Paste a token" sign-in, so the API decides, as for any token.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);

  const { el } = window.gpuBookingDom;

  async function call(method, body) {
    const res = await fetch('/demo/sign-in', {
      method,
      headers: body ? { 'Content-Type': 'application/json' } : {},
      body: body ? JSON.stringify(body) : undefined,
      credentials: 'omit',
    });
    const data = await res.json().catch(() => null);
    if (!res.ok) throw new Error((data && data.message) || ('HTTP ' + res.status));
    return data;
  }

  function render(box, users) {
    const problem = el('div', { id: 'demo-signin-problem', class: 'notice error', role: 'alert', hidden: 'hidden' });
    const input = el('input', {
      id: 'demo-user', type: 'text', list: 'demo-users', autocomplete: 'off', spellcheck: 'false',
      required: 'required', 'aria-describedby': 'demo-user-hint',
    });
    const admin = el('input', { id: 'demo-admin', type: 'checkbox' });
    const form = el('form', { id: 'demo-signin-form', novalidate: 'novalidate' },
      el('label', { for: 'demo-user', text: 'User name' }),
      el('p', { id: 'demo-user-hint', class: 'hint', text: 'Any name: the demo mints this user a token. Try a sample user: zoë has a running a100 booking.' }),
      input,
      el('datalist', { id: 'demo-users' }, users.map((u) => el('option', { value: u }))),
      el('div', { class: 'override' }, admin, el('label', { for: 'demo-admin', text: 'as an admin' })),
      el('button', { type: 'submit', id: 'demo-signin-button', text: 'Sign in as this user' }),
      problem);
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const user = input.value.trim();
      problem.hidden = true;
      if (!user) {
        problem.hidden = false;
        problem.textContent = 'Name the user to sign in as.';
        input.focus();
        return;
      }
      try {
        const r = await call('POST', { user, admin: admin.checked });
        // The page's own token sign-in takes it from here.
        $('token-input').value = r.token;
        $('token-form').requestSubmit();
        input.value = '';
        admin.checked = false;
      } catch (e) {
        problem.hidden = false;
        problem.textContent = 'The demo did not sign you in: ' + e.message;
        input.focus();
      }
    });
    box.replaceChildren(
      el('h3', { text: 'Demo: sign in as any user' }),
      el('p', { text: 'This demo lets you act as anyone, to see what each user sees. A real server has no such thing.' }),
      form);
    box.hidden = false;
  }

  function start() {
    const box = $('demo-signin');
    if (!box) return;
    call('GET').then((r) => render(box, (r && r.users) || []), () => {});
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
