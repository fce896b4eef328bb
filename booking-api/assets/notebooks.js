// "My notebooks" on the My bookings view: each running notebook pod of the signed-in
// user, booked, lent or on CPU, why, until when, its last GPU activity and what to do
// next. Talks only to GET /api/v1/notebooks (the controller's last report, kept by
// the service) with the page's token; loads whenever the view is shown, and every
// minute while it stays shown (a lent GPU's deadline comes from the cluster).
'use strict';

(function () {
  const TOKEN_KEY = 'gpu-booking-token';
  const REFRESH_MS = 60 * 1000;
  const STANDING = {
    booked: 'Booked GPU',
    lent: 'Lent GPU',
    stripped: 'On CPU',
  };
  const $ = (id) => document.getElementById(id);
  const { el } = window.gpuBookingDom;
  let timer = null;
  let ticker = null;

  async function fetchNotebooks() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = { Accept: 'application/json' };
    if (token) headers.Authorization = 'Bearer ' + token;
    const res = await fetch('/api/v1/notebooks', { headers, credentials: 'same-origin' });
    const data = await res.json().catch(() => null);
    if (!res.ok) throw new Error((data && data.message) || 'HTTP ' + res.status);
    return data;
  }

  const when = (t) => new Date(t).toLocaleString([], { dateStyle: 'medium', timeStyle: 'short' });

  function ago(t) {
    const minutes = Math.max(0, Math.round((Date.now() - new Date(t).getTime()) / 60000));
    if (minutes < 1) return 'just now';
    if (minutes < 60) return minutes + ' min ago';
    const hours = Math.round(minutes / 60);
    if (hours < 48) return hours + ' h ago';
    return Math.round(hours / 24) + ' days ago';
  }

  // Book: the booking form with the notebook's model chosen.
  function book(model) {
    location.hash = '#book';
    const select = $('book-model');
    if (select && model && [...select.options].some((o) => o.value === model)) {
      select.value = model;
      select.dispatchEvent(new Event('change', { bubbles: true }));
    }
    if (select) select.focus();
  }

  // Extend: the "Change the end of a booking" form with the booking chosen.
  function extend(bookingId) {
    const card = $('extend-card');
    const select = $('extend-booking');
    if (!card || card.hidden || !select) return;
    if ([...select.options].some((o) => o.value === String(bookingId))) {
      select.value = String(bookingId);
      select.dispatchEvent(new Event('change', { bubbles: true }));
    }
    card.scrollIntoView({ block: 'nearest' });
    $('extend-end').focus();
  }

  // Time left until `t`, counted down each second while the card is shown (a lent
  // GPU being taken back, an offer held).
  function left(t) {
    const s = Math.max(0, Math.round((new Date(t).getTime() - Date.now()) / 1000));
    if (s === 0) return 'now';
    if (s < 60) return 'in ' + s + ' s';
    if (s < 3600) return 'in ' + Math.floor(s / 60) + ' min ' + String(s % 60).padStart(2, '0') + ' s';
    return 'in ' + Math.round(s / 3600) + ' h';
  }

  const countdown = (t) => el('span', { class: 'nb-countdown', 'data-until': t, text: left(t) });

  function tick() {
    for (const c of document.querySelectorAll('#nb-list .nb-countdown')) c.textContent = left(c.dataset.until);
  }

  const offerWhat = (o) => (o.units > 1 ? o.units + ' ' + o.model + ' GPUs' : 'One ' + o.model + ' GPU');

  function step(kind, n) {
    switch (kind) {
      case 'book':
        return el('button', { type: 'button', class: 'secondary', 'data-step': 'book',
          text: n.model ? 'Book ' + n.model : 'Book a GPU', onclick: () => book(n.model) });
      case 'restart':
        // Nothing to press: the user restarts their server in JupyterHub, and its
        // new pod gets the GPU held for them.
        return n.offer ? el('p', { class: 'nb-offer', 'data-step': 'restart' },
          el('strong', { text: offerWhat(n.offer) + ' is held for you: restart your server to get it' }),
          ' (until ', el('time', { datetime: n.offer.until, text: when(n.offer.until) }), ', ',
          countdown(n.offer.until), ')',
          n.offer.restart ? '; it is restarted for you once idle, as you asked.' : '.') : null;
      case 'extend':
        return el('button', { type: 'button', class: 'secondary', 'data-step': 'extend',
          text: 'Extend booking ' + n.booking_id, onclick: () => extend(n.booking_id) });
      default:
        // A step this page does not know yet (the service may offer more).
        return null;
    }
  }

  function row(n) {
    const facts = [];
    if (n.ends_at) facts.push(el('li', {}, 'GPU until ', el('time', { datetime: n.ends_at, text: when(n.ends_at) })));
    if (n.taken_back_at) {
      facts.push(el('li', { class: 'nb-deadline' }, 'Taken back at ',
        el('time', { datetime: n.taken_back_at, text: when(n.taken_back_at) }), ' (', countdown(n.taken_back_at), ')'));
    }
    facts.push(el('li', { text: n.last_activity
      ? 'Last GPU activity ' + ago(n.last_activity)
      : (n.standing === 'stripped' ? 'No GPU' : 'No GPU activity seen') }));
    if (n.started) facts.push(el('li', { text: 'Started ' + when(n.started) }));
    const gpu = n.model ? n.model + (n.gpus > 1 ? ' ×' + n.gpus : '') : 'CPU';
    return el('li', { class: 'nb nb-' + n.standing, 'data-pod': n.namespace + '/' + n.pod },
      el('div', { class: 'nb-head' },
        el('strong', { class: 'nb-pod', text: n.pod }), ' ',
        el('span', { class: 'badge nb-standing', text: STANDING[n.standing] || n.standing }), ' ',
        el('span', { class: 'nb-gpu', text: gpu })),
      el('p', { class: 'nb-why', text: n.why }),
      el('ul', { class: 'nb-facts' }, facts),
      el('div', { class: 'nb-next' }, n.next.map((k) => step(k, n))));
  }

  function render(v) {
    const list = $('nb-list');
    const state = $('nb-state');
    if (!v.reported_at) {
      state.textContent = 'The cluster has not reported any notebooks yet.';
      list.replaceChildren();
      return;
    }
    state.textContent = 'As the cluster reported them ' + ago(v.reported_at) + '.';
    list.replaceChildren(...(v.notebooks.length
      ? v.notebooks.map(row)
      : [el('li', { class: 'hint', text: 'No notebook of yours is running.' })]));
  }

  async function load() {
    if (!sessionStorage.getItem(TOKEN_KEY)) return;
    try {
      render(await fetchNotebooks());
    } catch (e) {
      $('nb-state').textContent = 'Your notebooks could not be loaded: ' + e.message;
    }
  }

  function start() {
    const view = $('view-mine');
    if (!view || !$('nb-list')) return;
    const shown = () => {
      clearInterval(timer);
      clearInterval(ticker);
      timer = null;
      ticker = null;
      if (view.hidden) return;
      load();
      timer = setInterval(load, REFRESH_MS);
      ticker = setInterval(tick, 1000);
    };
    // app.js shows and hides the view; load each time it appears.
    new MutationObserver(shown).observe(view, { attributes: true, attributeFilter: ['hidden'] });
    shown();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
