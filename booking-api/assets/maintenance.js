// Maintenance windows on the Admin view: list, create, delete. A window over
// existing bookings is answered with those bookings (409 `bookings_in_the_way`,
// nothing changed): they are shown with a choice each (shorten to end where the
// window starts, or cancel), and only the admin's confirmation sends the window
// again with those choices (`resolve`). Only the REST API is called
// (/api/v1/maintenance...); it resolves, tells the users, and says why it refuses.
'use strict';

(function () {
  const { el, call } = window.gpuBookingDom;
  const $ = (id) => document.getElementById(id);

  let ctx = { admin: false, confirm: null, changed: null };
  let seq = 0;

  function problem(e, what) {
    return el('div', { class: 'notice error', 'data-code': e.code || '' },
      el('p', {}, el('strong', { text: what + '. ' })),
      el('p', { class: 'api-message' }, 'The booking service says: ', el('q', { text: e.message })));
  }

  function fmtTime(t) {
    return new Date(t).toLocaleString(undefined, {
      weekday: 'short', day: 'numeric', month: 'short', year: 'numeric', hour: '2-digit', minute: '2-digit', timeZoneName: 'short',
    });
  }

  const pad = (n) => String(n).padStart(2, '0');
  function toLocalInput(d) {
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + 'T' + pad(d.getHours()) + ':' + pad(d.getMinutes());
  }
  function fromLocalInput(v) {
    if (!/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}/.test(v)) return null;
    const d = new Date(v);
    return isNaN(d.getTime()) ? null : d;
  }

  function list(windows) {
    if (!windows.length) return el('p', { class: 'muted', id: 'mt-none', text: 'No maintenance window is planned.' });
    const now = Date.now();
    return el('div', { class: 'table-scroll' }, el('table', { class: 'maintenance' },
      el('caption', { class: 'sr-only', text: 'Maintenance windows' }),
      el('thead', {}, el('tr', {}, ['Model', 'Units', 'From', 'To', 'Reason', ''].map((c) => el('th', { scope: 'col' }, c || el('span', { class: 'sr-only', text: 'Actions' }))))),
      el('tbody', {}, windows.map((m) => el('tr', { 'data-id': m.id },
        el('td', { 'data-label': 'Model' }, m.model, new Date(m.start).getTime() <= now ? [' ', el('span', { class: 'badge status-active', text: 'now' })] : null),
        el('td', { 'data-label': 'Units', text: m.units }),
        el('td', { 'data-label': 'From', text: fmtTime(m.start) }),
        el('td', { 'data-label': 'To', text: fmtTime(m.end) }),
        el('td', { 'data-label': 'Reason', text: m.reason }),
        el('td', { 'data-label': 'Actions' }, el('button', { type: 'button', class: 'secondary small', onclick: (ev) => remove(m, ev.currentTarget) },
          'Delete', el('span', { class: 'sr-only', text: ' the maintenance window of ' + m.model + ' from ' + fmtTime(m.start) }))))))));
  }

  async function remove(m, button) {
    const yes = await ctx.confirm('Delete this maintenance window?', m.model + ' (' + m.reason + ') from ' + fmtTime(m.start) + ' to ' + fmtTime(m.end) + ': its units are free again from now.', 'Delete window');
    if (!yes) { button.focus(); return; }
    try {
      await call('DELETE', '/maintenance/' + m.id);
      await load();
      $('mt-result').replaceChildren(el('div', { class: 'notice ok', text: 'Deleted the maintenance window of ' + m.model + '.' }));
      if (ctx.changed) ctx.changed();
    } catch (e) {
      $('mt-result').replaceChildren(problem(e, 'Not deleted'));
    }
  }

  // The default choice for a booking in the way: shorten one that starts before the
  // window, cancel one that starts inside it (it cannot be shortened out of it).
  function defaultChoice(b, body) {
    return new Date(b.start) < new Date(body.start) ? 'shorten' : 'cancel';
  }

  // The bookings in the way, a choice each, and the confirmation.
  function inTheWay(e, body) {
    const bookings = e.body.bookings || [];
    const rows = bookings.map((b) => {
      const id = 'mt-choice-' + b.id;
      return el('tr', { 'data-booking': b.id },
        el('td', { 'data-label': 'Booking', text: b.id }),
        el('td', { 'data-label': 'User', text: b.user }),
        el('td', { 'data-label': 'From', text: fmtTime(b.start) }),
        el('td', { 'data-label': 'To', text: fmtTime(b.end) }),
        el('td', { 'data-label': 'Units', text: b.units }),
        el('td', { 'data-label': 'Do' },
          el('label', { for: id, class: 'sr-only', text: 'What to do with booking ' + b.id }),
          el('select', { id, 'data-booking': b.id },
            el('option', { value: 'shorten', text: 'end it when the window starts', selected: defaultChoice(b, body) === 'shorten' }),
            el('option', { value: 'cancel', text: 'cancel it', selected: defaultChoice(b, body) === 'cancel' }))));
    });
    const box = el('div', { class: 'notice warn in-the-way', id: 'mt-in-the-way' },
      // The API's message tells a client to send `resolve`; the admin reads what to do.
      el('p', {}, el('strong', { text: 'Nothing was changed yet. ' }),
        bookings.length + (bookings.length === 1 ? ' booking holds' : ' bookings hold') + ' units this window needs. Choose what happens to each, then confirm.'),
      el('div', { class: 'table-scroll' }, el('table', { class: 'bookings' },
        el('caption', { class: 'sr-only', text: 'Bookings in the way of the maintenance window' }),
        el('thead', {}, el('tr', {}, ['Booking', 'User', 'From', 'To', 'Units', 'Do'].map((c) => el('th', { scope: 'col', text: c })))),
        el('tbody', {}, rows))),
      el('p', { class: 'hint', text: 'Their users are told what changed and why.' }),
      el('div', { class: 'actions' },
        el('button', { type: 'button', class: 'danger', id: 'mt-confirm', onclick: () => confirmResolve(body, box) }, 'Change these bookings and block the units'),
        el('button', { type: 'button', class: 'secondary', onclick: () => { $('mt-result').replaceChildren(el('p', { class: 'muted', text: 'Nothing was changed.' })); } }, 'Keep the bookings')));
    return box;
  }

  async function confirmResolve(body, box) {
    const resolve = {};
    for (const s of box.querySelectorAll('select[data-booking]')) resolve[s.dataset.booking] = s.value;
    await send(Object.assign({}, body, { resolve }));
  }

  async function send(body) {
    const result = $('mt-result');
    const button = $('mt-submit');
    button.disabled = true;
    try {
      const m = await call('POST', '/maintenance', body);
      result.replaceChildren(el('div', { class: 'notice ok', id: 'mt-ok' },
        el('strong', { text: 'Blocked: ' }), m.units + (m.units === 1 ? ' unit' : ' units') + ' of ' + m.model + ' from ' + fmtTime(m.start) + ' to ' + fmtTime(m.end) + ' (' + m.reason + ').' +
        (body.resolve ? ' The bookings in the way were changed as chosen.' : '')));
      await load();
      if (ctx.changed) ctx.changed();
    } catch (e) {
      result.replaceChildren(e.code === 'bookings_in_the_way' && e.body && Array.isArray(e.body.bookings)
        ? inTheWay(e, body)
        : problem(e, 'Not blocked'));
    } finally {
      button.disabled = false;
    }
  }

  async function submit(ev) {
    ev.preventDefault();
    const start = fromLocalInput($('mt-start').value);
    const end = fromLocalInput($('mt-end').value);
    const reason = $('mt-reason').value.trim();
    const unitsText = $('mt-units').value.trim();
    if (!start || !end || !reason) {
      $('mt-result').replaceChildren(el('div', { class: 'notice error', text: 'Give a start, an end and a reason.' }));
      return;
    }
    const body = { model: $('mt-model').value, start: start.toISOString(), end: end.toISOString(), reason };
    if (unitsText) body.units = Number(unitsText);
    await send(body);
  }

  async function load() {
    const mine = ++seq;
    try {
      const [windows, models] = await Promise.all([call('GET', '/maintenance'), call('GET', '/models')]);
      if (mine !== seq) return;
      $('mt-list').replaceChildren(list(windows));
      const sel = $('mt-model');
      const keep = sel.value;
      sel.replaceChildren(...models.map((m) => el('option', { value: m.name, text: m.name + ' (' + m.units + (m.units === 1 ? ' unit' : ' units') + ')' })));
      if (keep && models.some((m) => m.name === keep)) sel.value = keep;
      if (!$('mt-start').value) {
        const s = new Date(Date.now() + 7 * 86400000);
        s.setMinutes(0, 0, 0);
        $('mt-start').value = toLocalInput(s);
        $('mt-end').value = toLocalInput(new Date(s.getTime() + 4 * 3600000));
      }
    } catch (e) {
      if (mine !== seq) return;
      $('mt-list').replaceChildren(problem(e, 'The maintenance windows could not be loaded'));
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('mt-form').addEventListener('submit', submit);
  });

  window.gpuBookingMaintenance = Object.freeze({
    shown(view, c) {
      ctx = c;
      if (view === 'admin' && c.admin) load();
    },
  });
})();
