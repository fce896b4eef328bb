// "Change the end of a booking" on the My bookings view: extend or shorten a planned
// or running booking (PATCH /api/v1/bookings/{id}). The service checks every rule
// (maximum duration, capacity, cooldown, never into the past) and says why it
// refuses; this only offers the control and shows the answer.
'use strict';

(function () {
  const TOKEN_KEY = 'gpu-booking-token';
  const $ = (id) => document.getElementById(id);

  function headers(json) {
    const h = { Accept: 'application/json' };
    if (json) h['Content-Type'] = 'application/json';
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) h.Authorization = 'Bearer ' + token;
    return h;
  }

  function toLocalInput(d) {
    const pad = (n) => String(n).padStart(2, '0');
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) +
      'T' + pad(d.getHours()) + ':' + pad(d.getMinutes());
  }

  function say(text, ok) {
    const out = $('extend-result');
    out.textContent = text;
    out.className = ok ? 'notice ok' : 'notice error';
  }

  async function load() {
    const box = $('extend-booking');
    if (!box) return;
    let list = [];
    try {
      const res = await fetch('/api/v1/bookings', { headers: headers(false), credentials: 'same-origin' });
      if (!res.ok) return;
      list = await res.json();
    } catch (e) {
      return;
    }
    const open = list.filter((b) => b.status === 'planned' || b.status === 'active');
    $('extend-card').hidden = open.length === 0;
    box.replaceChildren(...open.map((b) => {
      const o = document.createElement('option');
      o.value = String(b.id);
      o.dataset.end = b.end;
      o.textContent = b.model + ' #' + b.id + ' (' + b.status + ', ends ' + new Date(b.end).toLocaleString() + ')';
      return o;
    }));
    pick();
  }

  function pick() {
    const o = $('extend-booking').selectedOptions[0];
    if (o) $('extend-end').value = toLocalInput(new Date(o.dataset.end));
  }

  async function submit(ev) {
    ev.preventDefault();
    const id = $('extend-booking').value;
    const value = $('extend-end').value;
    if (!id || !value) return say('Choose a booking and its new end.', false);
    const end = new Date(value);
    if (Number.isNaN(end.getTime())) return say('The new end is not a valid time.', false);
    let res;
    try {
      res = await fetch('/api/v1/bookings/' + encodeURIComponent(id), {
        method: 'PATCH',
        headers: headers(true),
        credentials: 'same-origin',
        body: JSON.stringify({ end: end.toISOString() }),
      });
    } catch (e) {
      return say('The booking service could not be reached.', false);
    }
    const body = await res.json().catch(() => ({}));
    if (!res.ok) return say(body.message || ('The change was refused (HTTP ' + res.status + ').'), false);
    say('Booking #' + body.id + ' now ends ' + new Date(body.end).toLocaleString() +
      '. Your running notebook follows within seconds.', true);
    // app.js reloads the list on a route change.
    window.dispatchEvent(new HashChangeEvent('hashchange'));
    load();
  }

  function wire() {
    const form = $('extend-form');
    if (!form) return;
    form.addEventListener('submit', submit);
    $('extend-booking').addEventListener('change', pick);
    window.addEventListener('hashchange', () => { if (location.hash === '#mine') load(); });
    if (location.hash === '#mine') load();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', wire);
  else wire();
})();
