// The booking page. It implements no booking rule: it asks the REST API
// (/api/v1) and shows what it answers. Served by the binary; no other origin.
'use strict';

(function () {
  const API = '/api/v1';
  const TOKEN_KEY = 'gpu-booking-token';
  const MODE_KEY = 'gpu-booking-mode';
  const OIDC_KEY = 'gpu-booking-oidc-pending';
  // Where a JupyterHub sign-in returns to (the view it was started from).
  const BACK_KEY = 'gpu-booking-signin-back';
  const DAY_MS = 86400000;

  // ---------------------------------------------------------------- words

  // Each refusal code of the API as a sentence (the API's own message follows it).
  const RULES = {
    invalid_window: 'The end of a booking must come after its start.',
    start_in_past: 'A booking cannot start in the past.',
    duration_too_short: 'This booking is shorter than the shortest booking allowed.',
    duration_too_long: 'This booking is longer than the longest booking allowed.',
    too_far_ahead: 'This booking starts further ahead than bookings may be planned.',
    active_booking_exists: 'You cannot book while one of your bookings is running.',
    future_booking_exists: 'You already have a planned booking, and only a limited number of planned bookings is allowed per person.',
    cooldown: 'Too soon after your last booking: there is a waiting time (cooldown) between one booking and the next.',
    capacity: 'Every unit of this GPU model is already booked for part of that time.',
    unknown_model: 'There is no GPU model of that name.',
    overlap: 'That person already has a booking at that time.',
    not_cancellable: 'This booking has already ended or been cancelled.',
    unauthorized: 'You are not signed in, or your sign-in has expired.',
    forbidden: 'Your account is not allowed to do this.',
    not_found: 'It was not found.',
    invalid_request: 'The request was not accepted.',
    bad_request: 'The request was malformed.',
    unavailable: 'The booking database is unavailable right now; try again shortly.',
    internal: 'Something went wrong in the booking service.',
    network: 'The booking service cannot be reached.',
  };

  function ruleSentence(code) {
    return RULES[code] || 'The booking service refused the request.';
  }

  // Why the earliest start is not now, one reason of /me/next-start.
  function reasonText(r) {
    const until = fmtTime(r.until);
    switch (r.code) {
      case 'cooldown': return 'cooldown until ' + until + ' (waiting time after your last booking)';
      case 'active_booking_exists': return 'your running booking lasts until ' + until;
      case 'future_booking_exists': return 'you have a planned booking until ' + until;
      case 'capacity': return 'every unit is booked until ' + until;
      default: return r.message;
    }
  }

  // ---------------------------------------------------------------- state

  const state = {
    token: null,
    mode: null, // 'token' | 'oidc' | 'proxy'
    user: null,
    admin: false,
    models: [],
    prefill: null, // {value, iso}: the start input's pre-filled earliest start
    nextStartSeq: 0,
    mine: [],
    adminBookings: [],
    auditBefore: null,
  };

  const $ = (id) => document.getElementById(id);

  const { el } = window.gpuBookingDom;

  function announce(text) {
    const live = $('live');
    live.textContent = '';
    // A fresh text node each time, so that the same message is read again.
    window.setTimeout(() => { live.textContent = text; }, 30);
  }

  // ---------------------------------------------------------------- times

  const pad = (n) => String(n).padStart(2, '0');

  function fmtTime(t) {
    const d = t instanceof Date ? t : new Date(t);
    return d.toLocaleString(undefined, {
      weekday: 'short', day: 'numeric', month: 'short', year: 'numeric',
      hour: '2-digit', minute: '2-digit', timeZoneName: 'short',
    });
  }

  function fmtDay(isoDate) {
    const d = new Date(isoDate + 'T00:00:00Z');
    return d.toLocaleDateString(undefined, { weekday: 'long', day: 'numeric', month: 'long', timeZone: 'UTC' });
  }

  // The value of a datetime-local input, in the browser's time zone.
  function toLocalInput(d) {
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) +
      'T' + pad(d.getHours()) + ':' + pad(d.getMinutes());
  }

  // A datetime-local value (no offset) is read as local time.
  function fromLocalInput(v) {
    if (!/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?$/.test(v)) return null;
    const d = new Date(v);
    return isNaN(d.getTime()) ? null : d;
  }

  // The input shows minutes: round up, never to before the earliest start.
  function ceilMinute(d) {
    const ms = d.getTime();
    return new Date(Math.ceil(ms / 60000) * 60000);
  }

  function fmtDuration(ms) {
    const totalMin = Math.max(0, Math.floor(ms / 60000));
    const days = Math.floor(totalMin / 1440);
    const hours = Math.floor((totalMin % 1440) / 60);
    const mins = totalMin % 60;
    const parts = [];
    if (days) parts.push(days + (days === 1 ? ' day' : ' days'));
    if (hours) parts.push(hours + ' h');
    if (mins && days === 0) parts.push(mins + ' min');
    return parts.length ? parts.join(' ') : 'less than a minute';
  }

  function timeZoneName() {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || 'local'; } catch (e) { return 'local'; }
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, body) {
      super((body && body.message) || 'HTTP ' + status);
      this.status = status;
      this.code = (body && body.error) || 'http_' + status;
      this.earliest = body && body.earliest_start ? body.earliest_start : null;
    }
  }

  async function api(method, path, body, opts) {
    const headers = { Accept: 'application/json' };
    const token = opts && 'token' in opts ? opts.token : state.token;
    if (token) headers.Authorization = 'Bearer ' + token;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res;
    try {
      res = await fetch(API + path, {
        method, headers, credentials: 'same-origin',
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError(0, { error: 'network', message: 'The booking service cannot be reached.' });
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!res.ok) {
      const err = new ApiError(res.status, data && data.error ? data : { error: 'http_' + res.status, message: text.slice(0, 200) || res.statusText });
      if (res.status === 401 && state.mode && !(opts && opts.quiet401)) {
        signedOut('Your sign-in was refused or has expired (' + err.message + '). Sign in again.');
      }
      throw err;
    }
    return data;
  }

  const enc = encodeURIComponent;

  // ---------------------------------------------------------------- identity

  // The JWT payload, for display and to show the admin views; the API decides.
  function jwtClaims(token) {
    try {
      const part = token.split('.')[1];
      const b64 = part.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((part.length + 3) % 4);
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      return JSON.parse(new TextDecoder().decode(bytes));
    } catch (e) {
      return null;
    }
  }

  function identityFromToken(token) {
    const c = jwtClaims(token) || {};
    const roles = [].concat(Array.isArray(c.roles) ? c.roles : [],
      c.realm_access && Array.isArray(c.realm_access.roles) ? c.realm_access.roles : []);
    return { user: c.email || c.sub || null, admin: roles.includes('admin'), exp: c.exp || null };
  }

  // ---------------------------------------------------------------- OIDC (authorization code + PKCE)

  function oidcConfig() {
    const meta = (n) => {
      const m = document.querySelector('meta[name="gpu-booking-oidc-' + n + '"]');
      return m ? m.getAttribute('content').trim() : '';
    };
    const w = window.GPU_BOOKING_OIDC || {};
    const issuer = (w.issuer || meta('issuer')).replace(/\/+$/, '');
    const clientId = w.client_id || w.clientId || meta('client-id');
    if (!issuer || !clientId) return null;
    return {
      issuer, clientId,
      scope: w.scope || meta('scope') || 'openid email profile',
      tokenKind: (w.token || meta('token')) === 'id_token' ? 'id_token' : 'access_token',
    };
  }

  function b64url(bytes) {
    let s = '';
    for (const b of new Uint8Array(bytes)) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  }

  function randomString(n) {
    const a = new Uint8Array(n);
    crypto.getRandomValues(a);
    return b64url(a);
  }

  async function discover(cfg) {
    const res = await fetch(cfg.issuer + '/.well-known/openid-configuration', { credentials: 'omit' });
    if (!res.ok) throw new Error('the issuer\'s discovery document answered HTTP ' + res.status);
    const doc = await res.json();
    if (!doc.authorization_endpoint || !doc.token_endpoint) throw new Error('the discovery document names no authorization or token endpoint');
    if (doc.issuer && doc.issuer.replace(/\/+$/, '') !== cfg.issuer) throw new Error('the discovery document is for another issuer');
    return doc;
  }

  function redirectUri() {
    return location.origin + location.pathname;
  }

  async function oidcLogin(cfg) {
    const doc = await discover(cfg);
    if (!crypto.subtle) throw new Error('this browser offers no WebCrypto here (the page must be served over HTTPS)');
    const verifier = randomString(48);
    const challenge = b64url(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(verifier)));
    const pending = { state: randomString(24), nonce: randomString(24), verifier, token_endpoint: doc.token_endpoint, back: location.hash };
    sessionStorage.setItem(OIDC_KEY, JSON.stringify(pending));
    const q = new URLSearchParams({
      response_type: 'code', client_id: cfg.clientId, redirect_uri: redirectUri(), scope: cfg.scope,
      state: pending.state, nonce: pending.nonce, code_challenge: challenge, code_challenge_method: 'S256',
    });
    location.assign(doc.authorization_endpoint + (doc.authorization_endpoint.includes('?') ? '&' : '?') + q.toString());
  }

  // Back from the issuer with ?code&state (or ?error): exchange the code.
  async function oidcCallback(cfg, params) {
    const pending = JSON.parse(sessionStorage.getItem(OIDC_KEY) || 'null');
    sessionStorage.removeItem(OIDC_KEY);
    history.replaceState(null, '', location.pathname + ((pending && pending.back) || ''));
    if (params.get('error')) {
      throw new Error('the sign-in was refused: ' + params.get('error') + (params.get('error_description') ? ' (' + params.get('error_description') + ')' : ''));
    }
    if (!pending || params.get('state') !== pending.state) throw new Error('the sign-in answer does not match the request (state); start again');
    const res = await fetch(pending.token_endpoint, {
      method: 'POST', credentials: 'omit',
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', Accept: 'application/json' },
      body: new URLSearchParams({
        grant_type: 'authorization_code', code: params.get('code'), redirect_uri: redirectUri(),
        client_id: cfg.clientId, code_verifier: pending.verifier,
      }).toString(),
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error('the token exchange failed: ' + (body.error_description || body.error || 'HTTP ' + res.status));
    if (body.id_token) {
      const claims = jwtClaims(body.id_token);
      if (!claims || claims.nonce !== pending.nonce) throw new Error('the ID token does not match the request (nonce); start again');
    }
    const token = body[cfg.tokenKind] || body.access_token || body.id_token;
    if (!token) throw new Error('the issuer returned no token');
    return token;
  }

  // ---------------------------------------------------------------- sign-in

  function setSignedIn(mode, token, who) {
    state.mode = mode;
    state.token = token;
    state.user = who.user;
    state.admin = who.admin;
    if (token) {
      sessionStorage.setItem(TOKEN_KEY, token);
      sessionStorage.setItem(MODE_KEY, mode);
    }
    $('who').hidden = false;
    $('who-text').textContent = mode === 'proxy'
      ? 'Signed in through the sign-in proxy' + (state.user ? ' as ' + state.user : '')
      : 'Signed in as ' + (state.user || 'an unnamed user') + (state.admin ? ' (admin)' : '');
    $('sign-out').hidden = mode === 'proxy';
    $('tabs').hidden = false;
    $('tab-admin').hidden = !state.admin;
  }

  function signedOut(problem) {
    state.mode = null;
    state.token = null;
    state.user = null;
    state.admin = false;
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(MODE_KEY);
    $('who').hidden = true;
    $('tabs').hidden = true;
    const p = $('signin-problem');
    p.hidden = !problem;
    p.textContent = problem || '';
    showView('signin');
  }

  async function signInWithToken(token, mode) {
    // The API decides whether the token is good; the claims only label the page.
    await api('GET', '/models', undefined, { token, quiet401: true });
    setSignedIn(mode, token, identityFromToken(token));
    await enterApp();
  }

  // Without a token: does a proxy in front add one? Then the API answers.
  async function tryProxy() {
    try {
      await api('GET', '/models', undefined, { token: null, quiet401: true });
    } catch (e) {
      return false;
    }
    let admin = false;
    try {
      await api('GET', '/audit?limit=1', undefined, { token: null, quiet401: true });
      admin = true;
    } catch (e) { admin = false; }
    setSignedIn('proxy', null, { user: null, admin });
    return true;
  }

  // ---------------------------------------------------------------- views

  const VIEWS = ['signin', 'book', 'mine', 'admin', 'cluster', 'groups'];

  function showView(name) {
    $('loading').hidden = true;
    for (const v of VIEWS) $('view-' + v).hidden = v !== name;
    for (const a of document.querySelectorAll('#tabs a')) {
      if (a.dataset.view === name) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
  }

  // After the view changed under the keyboard user's feet: its heading.
  function focusViewHeading() {
    const view = document.querySelector('main > .view:not([hidden])');
    const h = view && view.querySelector('h2');
    if (h) { h.setAttribute('tabindex', '-1'); h.focus(); }
  }

  function route() {
    if (!state.mode) { showView('signin'); return; }
    const hash = location.hash.replace(/^#/, '');
    let view = hash.split('-')[0] || 'book';
    if (!['book', 'mine', 'admin', 'cluster', 'groups'].includes(view)) view = 'book';
    if (view === 'admin' && !state.admin) view = 'book';
    showView(view);
    // The demo's cluster view lives in cluster.js (absent outside the demo).
    if (window.gpuBookingCluster) window.gpuBookingCluster.shown(view === 'cluster', state.user);
    if (view === 'mine') loadMine();
    if (view === 'admin') loadAdmin();
    // The caller's rules, groups, courses and maintenance live in policy.js, groups.js,
    // reservations.js and maintenance.js.
    for (const part of [window.gpuBookingPolicy, window.gpuBookingGroups, window.gpuBookingReservations, window.gpuBookingMaintenance]) {
      if (part) part.shown(view, { user: state.user, admin: state.admin, changed: afterChange, confirm: confirmDialog });
    }
  }

  async function enterApp() {
    await loadModels();
    route();
    // The booking view's data loads whatever the view, so that it is ready.
    loadCalendar();
    refreshNextStart();
  }

  // ---------------------------------------------------------------- models and calendar

  async function loadModels() {
    state.models = await api('GET', '/models');
    for (const id of ['book-model', 'ac-model']) {
      const sel = $(id);
      const keep = sel.value;
      sel.replaceChildren(...state.models.map((m) =>
        el('option', { value: m.name, text: m.name + ' (' + m.units + (m.units === 1 ? ' unit' : ' units') + ')' })));
      if (keep && state.models.some((m) => m.name === keep)) sel.value = keep;
    }
    const f = $('ab-model');
    const keep = f.value;
    f.replaceChildren(el('option', { value: '', text: 'any model' }), ...state.models.map((m) => el('option', { value: m.name, text: m.name })));
    f.value = keep;
  }

  async function loadCalendar() {
    const box = $('calendar');
    try {
      // calendar.js: the lab's days, with course sessions and maintenance windows.
      const cal = window.gpuBookingCalendar;
      const all = await Promise.all(state.models.map((m) => cal ? cal.availability(m.name) : api('GET', '/models/' + enc(m.name) + '/availability')));
      box.replaceChildren(...all.map((a, i) => calendarFor(a, state.models[i])));
      if (cal) await cal.mark(box);
    } catch (e) {
      box.replaceChildren(errorBox(e, 'The calendar could not be loaded'));
    }
  }

  function calendarFor(av, model) {
    const title = 'cal-' + av.model;
    const table = el('table', { class: 'calendar', 'aria-labelledby': title, 'data-model': av.model });
    const head = el('tr', {}, ['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'].map((d) => el('th', { scope: 'col', text: d })));
    table.append(el('thead', {}, head));
    const body = el('tbody');
    let row = el('tr');
    const first = av.days.length ? new Date(av.days[0].date + 'T00:00:00Z').getUTCDay() : 1;
    const lead = (first + 6) % 7; // Monday first
    for (let i = 0; i < lead; i++) row.append(el('td', { class: 'day-blank', 'aria-hidden': 'true' }));
    for (const d of av.days) {
      if (row.children.length === 7) { body.append(row); row = el('tr'); }
      const cls = d.free === 0 ? 'day-none' : d.free >= av.units ? 'day-full' : 'day-some';
      const date = new Date(d.date + 'T00:00:00Z');
      const label = fmtDay(d.date) + ': ' + d.free + ' of ' + av.units + ' free';
      row.append(el('td', { class: 'day ' + cls, 'data-date': d.date, 'data-free': d.free, title: label },
        el('span', { class: 'date', 'aria-hidden': 'true', text: date.getUTCDate() + (date.getUTCDate() === 1 || d === av.days[0] ? ' ' + date.toLocaleDateString(undefined, { month: 'short', timeZone: 'UTC' }) : '') }),
        el('span', { class: 'free', 'aria-hidden': 'true' }, el('strong', { text: d.free }), '/' + av.units),
        el('span', { class: 'sr-only', text: label })));
    }
    if (row.children.length) body.append(row);
    table.append(body);
    // Units in use are not booked ones: pods without a booking borrow free units, and a
    // booking takes them back (a newcomer read "2 of 2 in use" as "nothing to book").
    const others = othersText(model);
    const usage = model ? ' · in use now: ' + model.in_use + ' of ' + model.units +
      ' (lent to users without a booking; a booking takes them back)' + (others ? ' · ' + others : '') : '';
    return el('div', { class: 'calendar-model' },
      el('h4', { id: title }, av.model, el('span', { class: 'muted', text: ' ' + av.units + (av.units === 1 ? ' unit' : ' units') + usage })),
      el('div', { class: 'table-scroll' }, table));
  }

  // ---------------------------------------------------------------- booking form

  let nextStartTimer = null;
  function refreshNextStartSoon() {
    window.clearTimeout(nextStartTimer);
    nextStartTimer = window.setTimeout(refreshNextStart, 250);
  }

  async function refreshNextStart() {
    const model = $('book-model').value;
    const days = $('book-days').value.trim();
    const box = $('book-earliest');
    if (!model) { box.replaceChildren(); return; }
    const seq = ++state.nextStartSeq;
    // A start typed while the answer is on its way is the user's choice: the answer
    // must not overwrite it (CI saw a typed start replaced by an earlier one).
    const startAsked = $('book-start').value;
    box.replaceChildren(el('p', { class: 'muted', text: 'Finding the earliest start…' }));
    try {
      const ns = await api('GET', '/me/next-start?model=' + enc(model) + (days ? '&days=' + enc(days) : ''));
      if (seq !== state.nextStartSeq) return;
      const start = new Date(ns.earliest_start);
      const now = Date.now();
      const reasons = ns.reasons || [];
      const parts = [el('p', { class: 'earliest-line' }, 'Earliest start: ', el('strong', { id: 'earliest-time', text: fmtTime(ceilMinute(start)) }),
        start.getTime() <= now + 60000 && !reasons.length ? ' — you can start right away.' : '')];
      if (reasons.length) {
        parts.push(el('p', { text: 'Not earlier because:' }),
          el('ul', { class: 'reasons' }, reasons.map((r) => el('li', { 'data-code': r.code, text: reasonText(r) }))));
      }
      box.replaceChildren(...parts);
      if ($('book-start').value === startAsked) prefillStart(ns.earliest_start);
    } catch (e) {
      if (seq !== state.nextStartSeq) return;
      box.replaceChildren(errorBox(e, 'No earliest start for this choice'));
    }
  }

  // Put the earliest start into the start input (local time, minutes), and
  // remember it so that an unchanged input sends the exact time.
  function prefillStart(iso) {
    const value = toLocalInput(ceilMinute(new Date(iso)));
    state.prefill = { value, iso };
    $('book-start').value = value;
    updateEnd();
  }

  function startFromInput() {
    const v = $('book-start').value;
    if (state.prefill && v === state.prefill.value && new Date(state.prefill.iso).getTime() > Date.now() + 5000) {
      return new Date(state.prefill.iso);
    }
    return fromLocalInput(v);
  }

  function daysFromInput(id) {
    const v = $(id).value.trim();
    return /^\d+$/.test(v) ? Number(v) : null;
  }

  function updateEnd() {
    const start = fromLocalInput($('book-start').value);
    const days = daysFromInput('book-days');
    $('book-end').textContent = start && days
      ? 'Ends ' + fmtTime(new Date(start.getTime() + days * DAY_MS)) + '.'
      : '';
  }

  async function submitBooking(ev) {
    ev.preventDefault();
    const result = $('book-result');
    const start = startFromInput();
    const days = daysFromInput('book-days');
    if (!start || !days) {
      result.replaceChildren(el('div', { class: 'notice error', text: 'Choose a start and a whole number of days.' }));
      (!start ? $('book-start') : $('book-days')).focus();
      return;
    }
    const body = { model: $('book-model').value, start: start.toISOString(), end: new Date(start.getTime() + days * DAY_MS).toISOString() };
    if (window.gpuBookingUnits && window.gpuBookingUnits.value() !== undefined) body.units = window.gpuBookingUnits.value(); // units.js
    const button = $('book-submit');
    button.disabled = true;
    result.replaceChildren(el('p', { class: 'muted', text: 'Booking…' }));
    try {
      const b = await api('POST', '/bookings', body);
      result.replaceChildren(el('div', { class: 'notice ok', id: 'book-ok' },
        el('strong', { text: 'Booked: ' }), b.model + ' from ' + fmtTime(b.start) + ' to ' + fmtTime(b.end) + ' (booking ' + b.id + '). ',
        el('a', { href: '#mine', text: 'See my bookings' })));
      await afterChange();
    } catch (e) {
      result.replaceChildren(refusalBox(e, (iso) => { prefillStart(iso); $('book-start').focus(); }));
    } finally {
      button.disabled = false;
    }
  }

  // A refusal: the rule in plain words, the API's message, and the earliest
  // time the API would accept, with a button to use it.
  function refusalBox(e, useTime) {
    const box = el('div', { class: 'notice error refusal', 'data-code': e.code },
      el('p', {}, el('strong', { text: 'Not booked. ' }), el('span', { class: 'rule', text: ruleSentence(e.code) })),
      el('p', { class: 'api-message' }, 'The booking service says: ', el('q', { text: e.message })));
    if (e.earliest) {
      box.append(el('p', { class: 'earliest-accepted' }, 'It would be accepted from ', el('strong', { text: fmtTime(e.earliest) }), '.'),
        el('button', { type: 'button', class: 'secondary use-time', onclick: () => useTime(e.earliest) }, 'Use this time'));
    }
    return box;
  }

  function errorBox(e, what) {
    return el('div', { class: 'notice error', 'data-code': e.code || '' },
      el('p', {}, el('strong', { text: what + '. ' }), ruleSentence(e.code)),
      e.message ? el('p', { class: 'api-message' }, 'The booking service says: ', el('q', { text: e.message })) : null);
  }

  // After a booking changed: the calendar, the earliest start and the lists.
  async function afterChange() {
    await Promise.all([
      loadModels().then(loadCalendar),
      refreshNextStart(),
      loadMine(),
      state.admin && !$('view-admin').hidden ? loadAdminBookings() : null,
    ]);
  }

  // ---------------------------------------------------------------- booking lists

  function statusBadge(s) {
    return el('span', { class: 'badge status-' + s, text: s });
  }

  // Why a running booking's pod waits for a card, in the controller's words (text,
  // never HTML): the booking holds, but the card is not there yet.
  function waitingNote(b) {
    return b.status === 'active' && b.waiting ? el('p', { class: 'waiting-note', text: b.waiting }) : null;
  }

  // Cards of a model that other workloads hold (pods our webhook did not admit,
  // which bookings never take back), with their namespaces; '' when none.
  function othersText(m) {
    if (!m || !(m.others_in_use > 0)) return '';
    const ns = m.other_namespaces && m.other_namespaces.length ? ' (namespaces: ' + m.other_namespaces.join(', ') + ')' : '';
    return m.others_in_use + ' held by other workloads' + ns;
  }

  // For admins: the declared units exceed what bookings can really get, and why.
  function overDeclaredText(m) {
    if (!m || !m.over_declared) return '';
    const why = [];
    if (m.cards !== null && m.cards !== undefined && m.cards < m.units) why.push('the nodes have ' + m.cards + (m.cards === 1 ? ' card' : ' cards'));
    if (m.others_in_use > 0) why.push('other workloads hold ' + m.others_in_use);
    return 'Declared ' + m.units + (m.units === 1 ? ' unit' : ' units') + '; bookings can get ' + m.bookable +
      (why.length ? ': ' + why.join(' and ') : '') + '.';
  }

  function timeNote(b) {
    const now = Date.now();
    if (b.status === 'active') return el('span', { class: 'time-left', text: fmtDuration(new Date(b.end).getTime() - now) + ' left' });
    if (b.status === 'planned') return el('span', { class: 'muted', text: 'starts in ' + fmtDuration(new Date(b.start).getTime() - now) });
    if (b.status === 'cancelled' && b.cancelled_at) return el('span', { class: 'muted', text: 'cancelled ' + fmtTime(b.cancelled_at) });
    if (b.ended_early_at) return el('span', { class: 'muted', text: 'ended early' });
    return '';
  }

  function bookingTable(list, withUser, caption) {
    if (!list.length) return el('p', { class: 'muted empty', text: 'No bookings.' });
    const cols = (withUser ? ['User'] : []).concat(['Model', 'Start', 'End', 'Status', 'Time', '']);
    const t = el('table', { class: 'bookings' },
      el('caption', { class: 'sr-only', text: caption }),
      el('thead', {}, el('tr', {}, cols.map((c) => el('th', { scope: 'col' }, c || el('span', { class: 'sr-only', text: 'Actions' }))))));
    const tb = el('tbody');
    for (const b of list) {
      const cells = [];
      if (withUser) cells.push(el('td', { 'data-label': 'User', text: b.user }));
      cells.push(
        el('td', { 'data-label': 'Model' }, b.model, b.override ? [' ', el('span', { class: 'badge badge-exception', text: 'override' })] : null),
        el('td', { 'data-label': 'Start', text: fmtTime(b.start) }),
        el('td', { 'data-label': 'End', text: fmtTime(b.end) }),
        el('td', { 'data-label': 'Status' }, statusBadge(b.status), waitingNote(b)),
        el('td', { 'data-label': 'Time', class: 'time-cell', 'data-id': b.id }, timeNote(b)),
        el('td', { 'data-label': 'Actions' }, actionButton(b)));
      tb.append(el('tr', { 'data-id': b.id, 'data-status': b.status }, cells));
    }
    t.append(tb);
    return el('div', { class: 'table-scroll' }, t);
  }

  function actionButton(b) {
    if (b.status === 'planned') {
      return el('button', { type: 'button', class: 'secondary', onclick: (ev) => cancelBooking(b, ev.currentTarget) }, 'Cancel',
        el('span', { class: 'sr-only', text: ' booking ' + b.id }));
    }
    if (b.status === 'active') {
      return el('button', { type: 'button', class: 'danger', onclick: (ev) => cancelBooking(b, ev.currentTarget) }, 'End early',
        el('span', { class: 'sr-only', text: ' booking ' + b.id }));
    }
    return '';
  }

  function confirmDialog(title, text, yes) {
    const d = $('confirm-dialog');
    $('confirm-title').textContent = title;
    $('confirm-text').textContent = text;
    $('confirm-yes').textContent = yes;
    d.returnValue = '';
    return new Promise((resolve) => {
      d.addEventListener('close', () => resolve(d.returnValue === 'yes'), { once: true });
      d.showModal();
      $('confirm-no').focus();
    });
  }

  async function cancelBooking(b, button) {
    const active = b.status === 'active';
    const section = button.closest('section');
    const who = b.user !== state.user ? ' of ' + b.user : '';
    const ok = await confirmDialog(
      active ? 'End this booking now?' : 'Cancel this booking?',
      (active
        ? 'Booking ' + b.id + who + ' (' + b.model + ') is running until ' + fmtTime(b.end) + '. Ending it now gives the GPU back; the waiting time before a next booking counts from now.'
        : 'Booking ' + b.id + who + ' (' + b.model + ') from ' + fmtTime(b.start) + ' to ' + fmtTime(b.end) + ' will be cancelled.'),
      active ? 'End it now' : 'Cancel booking');
    if (!ok) { button.focus(); return; }
    try {
      const r = await api('DELETE', '/bookings/' + b.id);
      announce('Booking ' + r.id + ' is now ' + r.status + '.');
    } catch (e) {
      announce(ruleSentence(e.code) + ' ' + e.message);
    }
    await afterChange();
    const heading = section && section.querySelector('h2, h3');
    if (heading) { heading.setAttribute('tabindex', '-1'); heading.focus(); }
  }

  async function loadMine() {
    if (!state.mode) return;
    const box = $('mine-list');
    try {
      state.mine = await api('GET', '/bookings');
      box.replaceChildren(bookingTable(state.mine, false, 'My bookings'));
    } catch (e) {
      box.replaceChildren(errorBox(e, 'Your bookings could not be loaded'));
    }
  }

  // The "time left" column moves on by itself.
  function tick() {
    for (const list of [state.mine, state.adminBookings]) {
      for (const b of list) {
        for (const cell of document.querySelectorAll('.time-cell[data-id="' + b.id + '"]')) cell.replaceChildren(timeNote(b));
      }
    }
  }

  // ---------------------------------------------------------------- admin

  function loadAdmin() {
    loadAdminBookings();
    loadModelsTable();
    loadAudit(false);
  }

  async function loadAdminBookings() {
    const box = $('ab-list');
    const q = new URLSearchParams({ all: 'true' });
    const user = $('ab-user').value.trim();
    const model = $('ab-model').value;
    if (user) q.set('user', user);
    if (model) q.set('model', model);
    try {
      state.adminBookings = await api('GET', '/bookings?' + q.toString());
      box.replaceChildren(bookingTable(state.adminBookings, true, 'All bookings'));
    } catch (e) {
      box.replaceChildren(errorBox(e, 'The bookings could not be loaded'));
    }
  }

  async function loadModelsTable() {
    const box = $('am-list');
    try {
      await loadModels();
    } catch (e) {
      box.replaceChildren(errorBox(e, 'The models could not be loaded'));
      return;
    }
    const rows = state.models.map((m) => modelForm(m));
    rows.push(modelForm(null));
    box.replaceChildren(...rows);
  }

  function modelForm(m) {
    const key = m ? m.name : 'new';
    const id = (f) => 'am-' + key + '-' + f;
    const form = el('form', { class: 'model-form' + (m ? '' : ' model-new'), 'data-model': key, novalidate: true },
      el('h4', { text: m ? m.name : 'Add a model' }),
      m ? el('p', { class: 'muted', text: 'In use now: ' + m.in_use + ' of ' + m.units + (m.usage_reported_at ? ' (reported ' + fmtTime(m.usage_reported_at) + ')' : ' (no usage reported yet)') + '. Resource: ' + (m.resource || 'the default') + '.' }) : null,
      othersText(m) ? el('p', { class: 'muted others-note', text: othersText(m) + '.' }) : null,
      overDeclaredText(m) ? el('p', { class: 'notice warn over-declared', text: overDeclaredText(m) }) : null,
      m ? null : el('div', {}, el('label', { for: id('name'), text: 'Name' }), el('input', { id: id('name'), name: 'name', type: 'text', autocomplete: 'off', required: true })),
      el('div', { class: 'model-fields' },
        el('div', {}, el('label', { for: id('units'), text: 'Units' }),
          el('input', { id: id('units'), name: 'units', type: 'number', min: '0', step: '1', value: m ? m.units : '1', required: true })),
        el('div', {}, el('label', { for: id('gpumem'), text: 'VRAM per pod (MiB)' }),
          el('input', { id: id('gpumem'), name: 'gpumem_mib', type: 'number', min: '0', step: '1', value: m ? m.gpumem_mib : '0' })),
        el('div', {}, el('label', { for: id('resource'), text: 'Extended resource' }),
          el('input', { id: id('resource'), name: 'resource', type: 'text', autocomplete: 'off', placeholder: 'nvidia.com/gpu', value: m && m.resource ? m.resource : '' })),
        el('div', { class: 'wide' }, el('label', { for: id('patterns'), text: 'Product name patterns, one per line' }),
          el('textarea', { id: id('patterns'), name: 'patterns', rows: '2', spellcheck: 'false' }))),
      el('button', { type: 'submit', text: m ? 'Save ' + m.name : 'Add model' }),
      el('div', { class: 'result', 'aria-live': 'polite' }));
    form.querySelector('textarea').value = m ? m.patterns.join('\n') : '';
    form.addEventListener('submit', (ev) => saveModel(ev, m));
    return form;
  }

  async function saveModel(ev, m) {
    ev.preventDefault();
    const f = ev.currentTarget;
    const result = f.querySelector('.result');
    const name = m ? m.name : f.elements.name.value.trim();
    const units = Number(f.elements.units.value);
    const gpumem = Number(f.elements.gpumem_mib.value || '0');
    const body = {
      units, gpumem_mib: gpumem,
      patterns: f.elements.patterns.value.split('\n').map((s) => s.trim()).filter(Boolean),
    };
    const resource = f.elements.resource.value.trim();
    if (resource) body.resource = resource;
    if (m) body.position = m.position;
    if (!name || !Number.isInteger(units) || !Number.isInteger(gpumem)) {
      result.replaceChildren(el('div', { class: 'notice error', text: 'Give a name and whole numbers for units and VRAM.' }));
      return;
    }
    try {
      const saved = await api('PUT', '/models/' + enc(name), body);
      announce('Saved ' + saved.name + ': ' + saved.units + ' units.');
      await loadModelsTable();
      const again = document.querySelector('.model-form[data-model="' + CSS.escape(saved.name) + '"] .result');
      if (again) again.replaceChildren(el('div', { class: 'notice ok', text: 'Saved: ' + saved.units + ' units.' }));
      loadCalendar();
      refreshNextStart();
    } catch (e) {
      result.replaceChildren(errorBox(e, 'Not saved'));
    }
  }

  async function loadAudit(more) {
    const box = $('aa-list');
    const q = new URLSearchParams({ limit: '50' });
    const action = $('aa-action').value.trim();
    const user = $('aa-user').value.trim();
    if (action) q.set('action', action);
    if (user) q.set('user', user);
    if (more && state.auditBefore) q.set('before', state.auditBefore);
    try {
      const events = await api('GET', '/audit?' + q.toString());
      const rows = events.map((e) => el('tr', { 'data-action': e.action, 'data-booking': e.booking_id == null ? '' : e.booking_id },
        el('td', { 'data-label': 'When', text: fmtTime(e.at) }),
        el('td', { 'data-label': 'Who', text: e.actor }),
        el('td', { 'data-label': 'Action' }, el('code', { text: e.action })),
        el('td', { 'data-label': 'Subject', text: e.subject || '' }),
        el('td', { 'data-label': 'User', text: e.user || '' }),
        el('td', { 'data-label': 'Booking', text: e.booking_id == null ? '' : e.booking_id }),
        el('td', { 'data-label': 'Details', class: 'details' }, el('code', { text: JSON.stringify(e.details) }))));
      let tbody = box.querySelector('tbody');
      if (!more || !tbody) {
        const t = el('table', { class: 'audit' },
          el('caption', { class: 'sr-only', text: 'Audit log, newest first' }),
          el('thead', {}, el('tr', {}, ['When', 'Who', 'Action', 'Subject', 'User', 'Booking', 'Details'].map((c) => el('th', { scope: 'col', text: c })))));
        tbody = el('tbody');
        t.append(tbody);
        box.replaceChildren(events.length ? el('div', { class: 'table-scroll' }, t) : el('p', { class: 'muted', text: 'No entries.' }));
      }
      tbody.append(...rows);
      state.auditBefore = events.length ? events[events.length - 1].id : state.auditBefore;
      $('aa-more').hidden = events.length < 50;
    } catch (e) {
      box.replaceChildren(errorBox(e, 'The audit log could not be loaded'));
    }
  }

  async function submitAdminBooking(ev) {
    ev.preventDefault();
    const result = $('ac-result');
    const user = $('ac-user').value.trim();
    const start = fromLocalInput($('ac-start').value);
    const days = daysFromInput('ac-days');
    if (!user || !start || !days) {
      result.replaceChildren(el('div', { class: 'notice error', text: 'Give the user, a start and a whole number of days.' }));
      (!user ? $('ac-user') : !start ? $('ac-start') : $('ac-days')).focus();
      return;
    }
    const override = $('ac-override').checked;
    const body = { user, model: $('ac-model').value, start: start.toISOString(), end: new Date(start.getTime() + days * DAY_MS).toISOString() };
    if (override) body.override = true;
    try {
      const b = await api('POST', '/bookings', body);
      result.replaceChildren(el('div', { class: 'notice ok' },
        el('strong', { text: override ? 'Booked as an exception: ' : 'Booked: ' }),
        b.model + ' for ' + b.user + ' from ' + fmtTime(b.start) + ' to ' + fmtTime(b.end) + ' (booking ' + b.id + ', ' + b.status + ').'));
      await afterChange();
      loadAudit(false);
    } catch (e) {
      result.replaceChildren(refusalBox(e, (iso) => { $('ac-start').value = toLocalInput(ceilMinute(new Date(iso))); $('ac-start').focus(); }));
    }
  }

  function syncOverride() {
    const on = $('ac-override').checked;
    $('admin-create').classList.toggle('override-on', on);
    $('ac-submit').textContent = on ? 'Book for this user as an exception' : 'Book for this user';
  }

  // ---------------------------------------------------------------- start

  function wire() {
    for (const t of document.querySelectorAll('.tz')) t.textContent = timeZoneName();
    $('token-form').addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const token = $('token-input').value.trim().replace(/^Bearer\s+/i, '');
      const p = $('signin-problem');
      if (!token) {
        p.hidden = false;
        p.textContent = 'Paste a token first.';
        $('token-input').focus();
        return;
      }
      try {
        await signInWithToken(token, 'token');
        $('token-input').value = '';
        announce('Signed in as ' + (state.user || 'an unnamed user') + '.');
        focusViewHeading();
      } catch (e) {
        p.hidden = false;
        p.textContent = 'This token was not accepted: ' + e.message;
        $('token-input').focus();
      }
    });
    $('sign-out').addEventListener('click', () => {
      signedOut(null);
      announce('Signed out.');
      $('signin-title').setAttribute('tabindex', '-1');
      $('signin-title').focus();
    });
    $('book-form').addEventListener('submit', submitBooking);
    $('book-model').addEventListener('change', refreshNextStart);
    $('book-days').addEventListener('input', () => { refreshNextStartSoon(); updateEnd(); });
    $('book-start').addEventListener('input', updateEnd);
    $('ab-filter').addEventListener('submit', (ev) => { ev.preventDefault(); loadAdminBookings(); });
    $('aa-filter').addEventListener('submit', (ev) => { ev.preventDefault(); state.auditBefore = null; loadAudit(false); });
    $('aa-more').addEventListener('click', () => loadAudit(true));
    $('ac-form').addEventListener('submit', submitAdminBooking);
    $('ac-override').addEventListener('change', syncOverride);
    window.addEventListener('hashchange', route);
    window.setInterval(tick, 30000);
    // The sign-in view shows the ways this server has: one button on a production
    // install, the token box folded away behind it (scripts and admins); the proxy's
    // explanation only where nothing else is set up.
    const cfg = oidcConfig();
    const hub = hubLoginPath();
    $('hub-signin').hidden = !hub;
    $('oidc-signin').hidden = !cfg;
    $('proxy-signin').hidden = Boolean(hub || cfg);
    $('token-signin').open = !(hub || cfg);
    if (hub) {
      $('hub-login').setAttribute('href', hub);
      $('hub-login').addEventListener('click', () => sessionStorage.setItem(BACK_KEY, location.hash));
    }
    if (cfg) {
      $('oidc-issuer').textContent = cfg.issuer;
      $('oidc-login').addEventListener('click', async () => {
        try {
          await oidcLogin(cfg);
        } catch (e) {
          const p = $('signin-problem');
          p.hidden = false;
          p.textContent = 'Single sign-on failed: ' + e.message;
        }
      });
    }
  }

  // The JupyterHub sign-in's start, where the server has it set up.
  function hubLoginPath() {
    const m = document.querySelector('meta[name="gpu-booking-hub-login"]');
    const path = m ? m.getAttribute('content') : '';
    return path && path.startsWith('/') ? path : null;
  }

  // A finished JupyterHub sign-in lands on the page with its token (or its problem)
  // in the fragment, which no server sees; it leaves the address bar at once.
  function hubCallback() {
    const h = new URLSearchParams(location.hash.slice(1));
    if (!h.has('hub-token') && !h.has('signin-error')) return null;
    const back = sessionStorage.getItem(BACK_KEY) || '';
    sessionStorage.removeItem(BACK_KEY);
    history.replaceState(null, '', location.pathname + location.search + back);
    return h.has('hub-token') ? { token: h.get('hub-token') } : { problem: h.get('signin-error') };
  }

  async function start() {
    wire();
    const cfg = oidcConfig();
    const params = new URLSearchParams(location.search);
    try {
      if (cfg && (params.has('code') || params.has('error')) && params.has('state')) {
        let token;
        try {
          token = await oidcCallback(cfg, params);
        } catch (e) {
          signedOut('Single sign-on failed: ' + e.message);
          return;
        }
        await signInWithToken(token, 'oidc');
        return;
      }
      const fromHub = hubCallback();
      if (fromHub && fromHub.problem) {
        signedOut('Signing in with JupyterHub failed: ' + fromHub.problem);
        return;
      }
      if (fromHub) {
        try {
          await signInWithToken(fromHub.token, 'hub');
        } catch (e) {
          signedOut('Signing in with JupyterHub failed: ' + e.message);
        }
        return;
      }
      const saved = sessionStorage.getItem(TOKEN_KEY);
      if (saved) {
        try {
          await signInWithToken(saved, sessionStorage.getItem(MODE_KEY) || 'token');
          return;
        } catch (e) {
          if (e.status === 401 && sessionStorage.getItem(MODE_KEY) === 'hub' && hubLoginPath()) {
            // The page's token from the hub lasts hours; the hub's own session
            // usually longer, so going through it again asks nothing.
            sessionStorage.removeItem(TOKEN_KEY);
            sessionStorage.setItem(BACK_KEY, location.hash);
            location.assign(hubLoginPath());
            return;
          }
          if (e.status === 401) { signedOut('Your sign-in was refused or has expired (' + e.message + '). Sign in again.'); return; }
          throw e;
        }
      }
      if (await tryProxy()) {
        await enterApp();
        return;
      }
      signedOut(null);
    } catch (e) {
      signedOut(ruleSentence(e.code) + ' ' + e.message);
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
