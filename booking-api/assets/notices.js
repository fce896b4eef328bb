// Notice preferences and the newest notices, in the "My bookings" view. Talks only
// to GET/PUT /api/v1/me/notices with the page's token (app.js keeps it in this tab's
// sessionStorage); loads whenever the view is shown.
'use strict';

(function () {
  const TOKEN_KEY = 'gpu-booking-token';
  const LABELS = {
    booking_starts: 'before my booking starts',
    booking_ends: 'before my booking ends',
    gpu_taken_back_soon: 'before a lent GPU is taken back (the warning)',
    gpu_taken_back: 'when a lent GPU is taken back',
    spawn_stripped: 'when a notebook starts without a GPU',
    processes_reclaimed: 'when idle GPU processes are ended',
    waitlist_promoted: 'when a waitlist entry becomes a booking',
    booking_idle: 'when a running booking has been idle for a while (release it early?)',
    gpu_offered: 'when a GPU frees for my notebook on CPU (restart to get it)',
    booking_changed_by_admin: 'when an admin shortens or cancels my booking (maintenance, fewer GPUs)',
  };
  const $ = (id) => document.getElementById(id);

  const { el } = window.gpuBookingDom;

  async function call(method, body) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = { Accept: 'application/json' };
    if (token) headers.Authorization = 'Bearer ' + token;
    if (body) headers['Content-Type'] = 'application/json';
    const res = await fetch('/api/v1/me/notices', {
      method, headers, credentials: 'same-origin', body: body ? JSON.stringify(body) : undefined,
    });
    const data = await res.json().catch(() => null);
    if (!res.ok) throw new Error((data && data.message) || 'HTTP ' + res.status);
    return data;
  }

  function say(text, bad) {
    const s = $('np-status');
    s.textContent = text;
    s.className = bad ? 'error' : 'hint';
  }

  function render(v) {
    const form = $('np-form');
    const channels = [];
    if (!v.channels.email && !v.channels.webhook) {
      channels.push(el('p', { class: 'hint', text: 'This installation sends no notices (no SMTP server or webhook is configured); the list below still shows them.' }));
    }
    channels.push(
      el('label', { class: 'np-check' },
        el('input', { type: 'checkbox', id: 'np-email-on', checked: v.prefs.email_enabled, disabled: !v.channels.email }),
        ' E-mail' + (v.channels.email ? '' : ' (not configured)')),
      el('label', { for: 'np-email' }, 'Address'),
      el('input', { type: 'email', id: 'np-email', maxlength: '254', autocomplete: 'email',
        value: v.prefs.email || '', placeholder: v.address || 'you@lab.example' }),
      el('label', { class: 'np-check' },
        el('input', { type: 'checkbox', id: 'np-webhook-on', checked: v.prefs.webhook_enabled, disabled: !v.channels.webhook }),
        ' Chat webhook' + (v.channels.webhook ? '' : ' (not configured)')));
    const kinds = el('fieldset', { class: 'np-kinds' }, el('legend', { text: 'Tell me' }),
      v.kinds.map((k) => el('label', { class: 'np-check' },
        el('input', { type: 'checkbox', name: 'np-kind', value: k, checked: !v.prefs.muted.includes(k) }),
        ' ' + (LABELS[k] || k))));
    const restart = el('label', { class: 'np-check' },
      el('input', { type: 'checkbox', id: 'np-restart-on-offer', checked: !!v.prefs.restart_on_offer }),
      ' Restart my server on a GPU when one frees (when my notebook runs on CPU and is idle)');
    form.replaceChildren(...channels, kinds, restart, el('button', { type: 'submit', id: 'np-save', text: 'Save notice settings' }));
    const list = $('np-recent');
    list.replaceChildren(...(v.recent.length
      ? v.recent.map((n) => el('li', { 'data-notice': n.kind },
          el('strong', { text: n.title }), ' ',
          el('span', { class: 'hint', text: new Date(n.created_at).toLocaleString() + (n.deliveries.length ? ' · ' + n.deliveries.join(', ') : '') }),
          el('div', { text: n.text })))
      : [el('li', { class: 'hint', text: 'No notices yet.' })]));
  }

  async function load() {
    if (!sessionStorage.getItem(TOKEN_KEY)) return;
    try { render(await call('GET')); say(''); } catch (e) { say('Notice settings could not be loaded: ' + e.message, true); }
  }

  async function save(ev) {
    ev.preventDefault();
    const muted = [...document.querySelectorAll('input[name="np-kind"]')].filter((c) => !c.checked).map((c) => c.value);
    const body = {
      email: $('np-email').value.trim() || null,
      email_enabled: $('np-email-on').checked,
      webhook_enabled: $('np-webhook-on').checked,
      muted,
      restart_on_offer: $('np-restart-on-offer').checked,
    };
    try { render(await call('PUT', body)); say('Saved.'); } catch (e) { say(e.message, true); }
  }

  function start() {
    const view = $('view-mine');
    const form = $('np-form');
    if (!view || !form) return;
    form.addEventListener('submit', save);
    // app.js shows and hides the view; load each time it appears.
    new MutationObserver(() => { if (!view.hidden) load(); })
      .observe(view, { attributes: true, attributeFilter: ['hidden'] });
    if (!view.hidden) load();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
