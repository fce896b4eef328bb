// The waitlist and the calendar feeds on the "My bookings" view: join a model's
// waitlist for the first window of N days, see each entry's place in line, cancel
// it; get (or replace, or revoke) the calendar links. Only the REST API is called,
// with the token app.js keeps for this tab (none behind a sign-in proxy).
'use strict';

(function () {
  const API = '/api/v1';
  const TOKEN_KEY = 'gpu-booking-token';
  const DAY_MS = 86400000;
  const $ = (id) => document.getElementById(id);

  const { el } = window.gpuBookingDom;

  async function call(method, path, body) {
    const headers = { Accept: 'application/json' };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = 'Bearer ' + token;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(API + path, {
      method, headers, credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = res.status === 204 ? null : await res.json().catch(() => null);
    if (!res.ok) throw new Error((data && data.message) || ('HTTP ' + res.status));
    return data;
  }

  function fmtTime(t) {
    return new Date(t).toLocaleString(undefined, {
      weekday: 'short', day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit', timeZoneName: 'short',
    });
  }

  function fmtLength(seconds) {
    const days = seconds / 86400;
    if (Number.isInteger(days)) return days === 1 ? '1 day' : days + ' days';
    const hours = Math.round(seconds / 3600);
    return hours === 1 ? '1 hour' : hours + ' hours';
  }

  // A date input's value as local midnight, as a Date.
  function localDate(value) {
    const [y, m, d] = value.split('-').map(Number);
    return new Date(y, m - 1, d);
  }

  function dateValue(d) {
    const p = (n) => String(n).padStart(2, '0');
    return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate());
  }

  // ------------------------------------------------------------ waitlist

  const STATE_TEXT = {
    waiting: 'waiting', booked: 'booked', cancelled: 'cancelled', expired: 'expired (nothing fitted in time)',
  };

  function entryRow(e) {
    const where = e.state === 'waiting'
      ? el('strong', { class: 'wl-position', text: '#' + e.position + ' in line' })
      : (e.state === 'booked' ? 'booking ' + e.booking_id : '');
    const cancel = e.state === 'waiting'
      ? el('button', {
        type: 'button', class: 'secondary small', 'aria-label': 'Leave the waitlist of ' + e.model,
        onclick: () => leave(e),
      }, 'Leave')
      : null;
    return el('tr', { 'data-entry': e.id, 'data-state': e.state },
      el('td', { text: e.model }),
      el('td', { text: fmtLength(e.duration_seconds) }),
      el('td', {}, fmtTime(e.not_before), ' – ', fmtTime(e.latest_start)),
      el('td', {}, el('span', { class: 'badge', text: STATE_TEXT[e.state] || e.state })),
      el('td', {}, where),
      el('td', {}, cancel));
  }

  async function loadEntries() {
    const box = $('wl-list');
    try {
      const entries = await call('GET', '/waitlist?limit=50');
      if (!entries.length) {
        box.replaceChildren(el('p', { class: 'muted', text: 'You are on no waitlist.' }));
        return;
      }
      const head = el('tr', {}, ['Model', 'Length', 'Start between', 'State', 'Place', ''].map((h) => el('th', { scope: 'col', text: h })));
      box.replaceChildren(el('div', { class: 'table-scroll' },
        el('table', { class: 'bookings wl-table' }, el('thead', {}, head), el('tbody', {}, entries.map(entryRow)))));
    } catch (e) {
      box.replaceChildren(el('p', { class: 'notice error', text: 'The waitlist could not be loaded: ' + e.message }));
    }
  }

  async function loadModels() {
    const select = $('wl-model');
    if (select.options.length) return;
    try {
      const models = await call('GET', '/models');
      select.replaceChildren(...models.map((m) => el('option', { value: m.name, text: m.name })));
    } catch (e) { /* the list says why */ }
  }

  async function join(ev) {
    ev.preventDefault();
    const out = $('wl-result');
    const days = Number($('wl-days').value);
    const from = $('wl-from').value ? localDate($('wl-from').value) : new Date();
    // The latest start is the end of the chosen day.
    const latest = $('wl-latest').value ? new Date(localDate($('wl-latest').value).getTime() + DAY_MS - 1000) : null;
    if (!Number.isInteger(days) || days < 1) { out.textContent = 'The number of days must be a whole number, at least 1.'; return; }
    const body = { model: $('wl-model').value, days, from: new Date(Math.max(from.getTime(), Date.now())).toISOString() };
    if (latest) body.latest_start = latest.toISOString();
    try {
      const e = await call('POST', '/waitlist', body);
      out.textContent = e.state === 'booked'
        ? 'A window was free: you are booked (booking ' + e.booking_id + ').'
        : 'You are on the waitlist of ' + e.model + ', #' + e.position + ' in line. You are booked the moment a window fits.';
    } catch (e) {
      out.textContent = 'Not added: ' + e.message;
    }
    await loadEntries();
  }

  async function leave(e) {
    try {
      await call('DELETE', '/waitlist/' + e.id);
      $('wl-result').textContent = 'You left the waitlist of ' + e.model + '.';
    } catch (err) {
      $('wl-result').textContent = 'Could not leave the waitlist: ' + err.message;
    }
    await loadEntries();
  }

  // ------------------------------------------------------------ calendar feeds

  function absolute(path) {
    return location.origin + path;
  }

  function feedLinks(issued, models) {
    const link = (label, path) => el('li', {},
      el('span', { class: 'feed-label', text: label }),
      el('input', { type: 'text', readonly: 'readonly', class: 'feed-url', value: absolute(path), 'aria-label': 'Calendar link: ' + label }));
    return el('ul', { class: 'feed-links' },
      link('My bookings', issued.bookings_path),
      models.map((m) => link('When ' + m + ' is booked', issued.model_path_template.replace('{model}', encodeURIComponent(m)))));
  }

  async function loadFeed() {
    try {
      const status = await call('GET', '/me/feed-token');
      $('feed-state').textContent = status.active
        ? 'You have calendar links, made ' + fmtTime(status.issued_at) + '. The links are shown only when made: make new ones if you lost them (the old ones stop working).'
        : 'You have no calendar links.';
      $('feed-revoke').hidden = !status.active;
      $('feed-issue').textContent = status.active ? 'Make new links' : 'Make calendar links';
    } catch (e) {
      $('feed-state').textContent = 'The calendar links could not be loaded: ' + e.message;
    }
  }

  async function issue() {
    try {
      const issued = await call('POST', '/me/feed-token');
      const models = [...$('wl-model').options].map((o) => o.value);
      $('feed-links').replaceChildren(
        el('p', { class: 'hint', text: 'Add these to your calendar app as subscriptions (by URL). Anyone with a link sees what it shows: keep them private.' }),
        feedLinks(issued, models));
    } catch (e) {
      $('feed-links').replaceChildren(el('p', { class: 'notice error', text: 'No links made: ' + e.message }));
    }
    await loadFeed();
  }

  async function revoke() {
    try {
      await call('DELETE', '/me/feed-token');
      $('feed-links').replaceChildren(el('p', { class: 'hint', text: 'Your calendar links no longer work.' }));
    } catch (e) {
      $('feed-links').replaceChildren(el('p', { class: 'notice error', text: 'Not revoked: ' + e.message }));
    }
    await loadFeed();
  }

  // ------------------------------------------------------------ wiring

  let wired = false;
  async function shown() {
    if (!wired) {
      wired = true;
      $('wl-form').addEventListener('submit', join);
      $('feed-issue').addEventListener('click', issue);
      $('feed-revoke').addEventListener('click', revoke);
      $('wl-from').value = dateValue(new Date());
    }
    await loadModels();
    await Promise.all([loadEntries(), loadFeed()]);
  }

  // app.js shows and hides the views; load whenever "My bookings" is shown.
  function watch() {
    const view = $('view-mine');
    if (!view) return;
    const check = () => { if (!view.hidden) shown(); };
    new MutationObserver(check).observe(view, { attributes: true, attributeFilter: ['hidden'] });
    check();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', watch);
  else watch();
})();
