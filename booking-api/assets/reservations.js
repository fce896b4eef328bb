// The course schedule on the Groups and courses view: every course reservation with
// its sessions (everyone); admins and a group's owners reserve sessions in plain
// words (weekdays, times in the lab's time zone, number of weeks: the page writes
// the RFC 5545 rule the API takes), cancel one session (a holiday) or remove a
// reservation. Only the REST API is called (/api/v1/reservations...); it places the
// sessions and says which one does not fit.
'use strict';

(function () {
  const { el, call, labZone } = window.gpuBookingDom;
  const $ = (id) => document.getElementById(id);
  const DAY_MS = 86400000;
  const DAYS = ['MO', 'TU', 'WE', 'TH', 'FR', 'SA', 'SU'];
  const DAY_NAMES = { MO: 'Mon', TU: 'Tue', WE: 'Wed', TH: 'Thu', FR: 'Fri', SA: 'Sat', SU: 'Sun' };

  let ctx = { admin: false, confirm: null, changed: null };
  let managed = new Set(); // groups whose reservations the caller manages (all for admins)
  let seq = 0;

  const cal = () => window.gpuBookingCalendar;
  const zone = () => (cal() ? cal().zone() : 'UTC');

  function problem(e, what) {
    return el('div', { class: 'notice error', 'data-code': e.code || '' },
      el('p', {}, el('strong', { text: what + '. ' })),
      el('p', { class: 'api-message' }, 'The booking service says: ', el('q', { text: e.message })));
  }

  // A session's day and times in the lab's time zone.
  function fmtSession(start, end) {
    const tz = zone();
    const day = new Date(start).toLocaleDateString(undefined, { weekday: 'short', day: 'numeric', month: 'short', year: 'numeric', timeZone: tz });
    return day + ', ' + cal().clock(start, tz) + '–' + cal().clock(end, tz);
  }

  // A rule the page wrote (or one like it) in words; the rule itself otherwise.
  function ruleWords(r) {
    const parts = Object.fromEntries(r.rrule.split(';').map((kv) => kv.split('=')));
    const time = r.start && r.end ? ', ' + r.start.slice(11, 16) + '–' + r.end.slice(11, 16) : '';
    if (parts.FREQ === 'WEEKLY' && parts.BYDAY && !parts.INTERVAL) {
      const days = parts.BYDAY.split(',').map((d) => DAY_NAMES[d] || d);
      const count = parts.COUNT ? ', ' + parts.COUNT + ' sessions' : '';
      return 'every ' + days.join(' and ') + time + ' (' + r.time_zone + ')' + count;
    }
    return r.rrule + time + ' (' + r.time_zone + ')';
  }

  function reservationCard(r, now) {
    const manage = ctx.admin || (r.group && managed.has(r.group));
    const ahead = r.occurrences.filter((o) => new Date(o.end).getTime() > now);
    const running = ahead.find((o) => !o.cancelled && new Date(o.start).getTime() <= now);
    const rows = ahead.map((o) => el('tr', { 'data-start': o.start, 'data-cancelled': o.cancelled ? 'true' : 'false' },
      el('td', { 'data-label': 'Session', text: fmtSession(o.start, o.end) }),
      el('td', { 'data-label': 'State' }, o.cancelled
        ? el('span', { class: 'badge status-cancelled', text: 'cancelled' })
        : new Date(o.start).getTime() <= now ? el('span', { class: 'badge status-active', text: 'running' }) : el('span', { class: 'badge status-planned', text: 'planned' })),
      el('td', { 'data-label': 'Actions' }, manage && !o.cancelled
        ? el('button', { type: 'button', class: 'secondary small', onclick: (ev) => cancelSession(r, o, ev.currentTarget) },
          new Date(o.start).getTime() <= now ? 'End this session now' : 'Cancel this session',
          el('span', { class: 'sr-only', text: ' of ' + r.title + ' on ' + fmtSession(o.start, o.end) }))
        : '')));
    return el('section', { class: 'course-card', 'data-reservation': r.id, 'aria-labelledby': 'cr-h-' + r.id },
      el('h4', { id: 'cr-h-' + r.id }, r.title,
        running ? [' ', el('span', { class: 'badge status-active', text: 'in session now' })] : null),
      el('p', { class: 'course-what' },
        (r.group ? r.group + ': ' : '') + r.units + ' × ' + r.model + ', ' + ruleWords(r) + '.'),
      ahead.length
        ? el('div', { class: 'table-scroll' }, el('table', { class: 'sessions' },
          el('caption', { class: 'sr-only', text: 'Sessions of ' + r.title }),
          el('thead', {}, el('tr', {}, ['Session', 'State', ''].map((c) => el('th', { scope: 'col' }, c || el('span', { class: 'sr-only', text: 'Actions' }))))),
          el('tbody', {}, rows)))
        : el('p', { class: 'muted', text: 'No sessions to come.' }),
      manage ? el('button', { type: 'button', class: 'danger small', onclick: (ev) => removeReservation(r, ev.currentTarget) },
        'Remove the whole reservation', el('span', { class: 'sr-only', text: ' ' + r.title })) : null,
      el('div', { class: 'result', 'aria-live': 'polite' }));
  }

  async function cancelSession(r, o, button) {
    const running = new Date(o.start).getTime() <= Date.now();
    const yes = await ctx.confirm(running ? 'End this session now?' : 'Cancel this session?',
      r.title + ' on ' + fmtSession(o.start, o.end) + ': its ' + r.units + (r.units === 1 ? ' unit is' : ' units are') + ' free again for bookings.',
      running ? 'End it now' : 'Cancel session');
    if (!yes) { button.focus(); return; }
    try {
      await call('DELETE', '/reservations/' + r.id + '/occurrences/' + encodeURIComponent(o.start));
      await afterChange(r.id, 'Session of ' + fmtSession(o.start, o.end) + (running ? ' ended.' : ' cancelled.'));
    } catch (e) {
      showIn(r.id, problem(e, 'Not cancelled'));
    }
  }

  async function removeReservation(r, button) {
    const yes = await ctx.confirm('Remove ' + r.title + '?', 'Every session to come is cancelled (one that runs ends now), and its units are free again.', 'Remove reservation');
    if (!yes) { button.focus(); return; }
    try {
      await call('DELETE', '/reservations/' + r.id);
      await afterChange(null, 'Removed ' + r.title + '.');
    } catch (e) {
      showIn(r.id, problem(e, 'Not removed'));
    }
  }

  function showIn(id, node) {
    const box = id === null ? $('cr-result') : document.querySelector('.course-card[data-reservation="' + id + '"] .result');
    if (box) box.replaceChildren(node);
  }

  async function afterChange(id, text) {
    await load();
    showIn(id === null ? null : id, el('div', { class: 'notice ok', text }));
    if (ctx.changed) ctx.changed();
  }

  // ------------------------------------------------------------ the form

  function chosenDays() {
    return [...document.querySelectorAll('input[name="cr-day"]:checked')].map((c) => c.value);
  }

  // The form as the API's request, or a sentence saying what is missing.
  function request() {
    const days = chosenDays();
    const from = $('cr-from').value;
    const start = $('cr-start').value;
    const end = $('cr-end').value;
    const weeks = Number($('cr-weeks').value);
    if (!days.length) return { problem: 'Choose the weekdays of the sessions.' };
    if (!/^\d{4}-\d{2}-\d{2}$/.test(from)) return { problem: 'Choose the week the sessions start.' };
    if (!/^\d{2}:\d{2}/.test(start) || !/^\d{2}:\d{2}/.test(end)) return { problem: 'Give the sessions\' start and end times.' };
    if (end.slice(0, 5) <= start.slice(0, 5)) return { problem: 'A session must end after it starts, on the same day.' };
    if (!Number.isInteger(weeks) || weeks < 1) return { problem: 'Give a whole number of weeks.' };
    // The first session: the first chosen weekday from that date on. Each week from
    // it has one session per chosen day, so the count is weeks times days.
    let first = from;
    for (let i = 0; i < 7; i++) {
      const d = new Date(Date.parse(from + 'T00:00:00Z') + i * DAY_MS);
      if (days.includes(DAYS[(d.getUTCDay() + 6) % 7])) { first = d.toISOString().slice(0, 10); break; }
    }
    const ordered = DAYS.filter((d) => days.includes(d));
    const rrule = 'FREQ=WEEKLY;BYDAY=' + ordered.join(',') + ';COUNT=' + weeks * ordered.length;
    const body = {
      group: $('cr-group').value,
      title: $('cr-title-input').value.trim(),
      model: $('cr-model').value,
      units: Number($('cr-units').value),
      start: first + 'T' + start.slice(0, 5) + ':00',
      end: first + 'T' + end.slice(0, 5) + ':00',
      rrule,
      skip_conflicts: $('cr-skip').checked,
    };
    // Where the page does not know the lab's zone, the API takes its own (the lab's).
    if (labZone()) body.time_zone = labZone();
    const words = ordered.map((d) => DAY_NAMES[d]).join(' and ') + ', ' + start.slice(0, 5) + '–' + end.slice(0, 5) +
      ' (' + (body.time_zone || 'lab time') + '), for ' + weeks + (weeks === 1 ? ' week' : ' weeks') + ' from ' +
      new Date(first + 'T00:00:00Z').toLocaleDateString(undefined, { weekday: 'short', day: 'numeric', month: 'short', year: 'numeric', timeZone: 'UTC' }) +
      ': ' + weeks * ordered.length + ' sessions';
    return { body, words };
  }

  function summarise() {
    const r = request();
    const box = $('cr-summary');
    if (r.problem) { box.textContent = ''; return; }
    box.replaceChildren('Sessions: ' + r.words + ' — rule ', el('code', { id: 'cr-rrule', text: r.body.rrule }), '.');
  }

  async function submit(ev) {
    ev.preventDefault();
    const result = $('cr-result');
    const r = request();
    if (r.problem) { result.replaceChildren(el('div', { class: 'notice error', text: r.problem })); return; }
    if (!r.body.title) { result.replaceChildren(el('div', { class: 'notice error', text: 'Give the course a title.' })); $('cr-title-input').focus(); return; }
    const button = $('cr-submit');
    button.disabled = true;
    try {
      const made = await call('POST', '/reservations', r.body);
      const held = made.occurrences.filter((o) => !o.cancelled).length;
      await load();
      result.replaceChildren(el('div', { class: 'notice ok', id: 'cr-ok' },
        el('strong', { text: 'Reserved: ' }), made.title + ' for ' + made.group + ', ' + held + (held === 1 ? ' session' : ' sessions') +
        (made.skipped.length ? ' (' + made.skipped.length + ' left out)' : '') + '.'));
      if (ctx.changed) ctx.changed();
    } catch (e) {
      result.replaceChildren(problem(e, 'Not reserved'));
    } finally {
      button.disabled = false;
    }
  }

  async function fillForm(models, groups) {
    const keep = (sel, opts) => {
      const v = sel.value;
      sel.replaceChildren(...opts.map((o) => el('option', { value: o, text: o })));
      if (opts.includes(v)) sel.value = v;
    };
    keep($('cr-group'), groups);
    keep($('cr-model'), models.map((m) => m.name));
    if (!$('cr-from').value) {
      const d = new Date(Date.now() + DAY_MS);
      $('cr-from').value = cal() ? cal().dateIn(d, zone()) : d.toISOString().slice(0, 10);
    }
    summarise();
  }

  async function load() {
    const mine = ++seq;
    let list;
    let policy;
    let groups = [];
    let models = [];
    try {
      [list, policy, models] = await Promise.all([call('GET', '/reservations'), call('GET', '/policy'), call('GET', '/models')]);
      groups = ctx.admin ? (await call('GET', '/groups')).map((g) => g.name) : policy.groups.filter((g) => g.role === 'owner').map((g) => g.name);
    } catch (e) {
      if (mine !== seq) return;
      $('cr-list').replaceChildren(problem(e, 'The course schedule could not be loaded'));
      return;
    }
    if (mine !== seq) return;
    managed = new Set(groups);
    const now = Date.now();
    $('cr-list').replaceChildren(...(list.length
      ? list.map((r) => reservationCard(r, now))
      : [el('p', { class: 'muted', id: 'cr-none', text: 'No course has sessions to come.' })]));
    $('cr-form').hidden = !groups.length;
    if (groups.length) fillForm(models, groups);
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('cr-form').addEventListener('submit', submit);
    $('cr-form').addEventListener('input', summarise);
    $('cr-form').addEventListener('change', summarise);
    for (const t of document.querySelectorAll('.lab-tz')) t.textContent = zone();
  });

  window.gpuBookingReservations = Object.freeze({
    shown(view, c) {
      ctx = c;
      if (view === 'groups') load();
    },
    refresh: load,
  });
})();
