// The booking calendar's days in the lab's time zone (the server's
// `gpu-booking-time-zone`; UTC where it names none), with the course sessions and
// maintenance windows of each day. The API answers free units per day of the zone
// the page asks for (this one; its `--time-zone` by default), each from its midnight
// to the next, so a day's count is shown as it comes. app.js draws the grid from
// availability() and calls mark() on it.
'use strict';

(function () {
  const { el, call, labZone } = window.gpuBookingDom;
  const DAY_MS = 86400000;
  const enc = encodeURIComponent;

  function zone() {
    return labZone() || 'UTC';
  }

  // The wall-clock fields of `instant` in `tz`.
  function partsIn(instant, tz) {
    const f = new Intl.DateTimeFormat('en-CA', {
      timeZone: tz, year: 'numeric', month: '2-digit', day: '2-digit',
      hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23',
    });
    const p = Object.fromEntries(f.formatToParts(instant).map((x) => [x.type, x.value]));
    return { y: Number(p.year), mo: Number(p.month), d: Number(p.day), h: Number(p.hour), mi: Number(p.minute), s: Number(p.second) };
  }

  // How far `tz`'s wall clock is ahead of UTC at `instant`, in milliseconds.
  function offsetMs(instant, tz) {
    const p = partsIn(instant, tz);
    const wall = Date.UTC(p.y, p.mo - 1, p.d, p.h, p.mi, p.s);
    return wall - Math.floor(instant.getTime() / 1000) * 1000;
  }

  // The instant of a wall-clock time in `tz` (in a gap, the offset before it).
  function zonedToUtc(y, mo, d, h, mi, tz) {
    const wall = Date.UTC(y, mo - 1, d, h, mi);
    const first = offsetMs(new Date(wall), tz);
    const guess = wall - first;
    const second = offsetMs(new Date(guess), tz);
    return new Date(second === first ? guess : wall - second);
  }

  const pad = (n) => String(n).padStart(2, '0');

  // `YYYY-MM-DD` of `instant` in `tz`.
  function dateIn(instant, tz) {
    const p = partsIn(instant, tz);
    return p.y + '-' + pad(p.mo) + '-' + pad(p.d);
  }

  // The date `n` days after the date `iso` (dates are zone-free).
  function addDays(iso, n) {
    return new Date(Date.parse(iso + 'T00:00:00Z') + n * DAY_MS).toISOString().slice(0, 10);
  }

  // The lab day `iso` as a span of instants.
  function daySpan(iso, tz) {
    const [y, mo, d] = iso.split('-').map(Number);
    const next = addDays(iso, 1).split('-').map(Number);
    return { start: zonedToUtc(y, mo, d, 0, 0, tz), end: zonedToUtc(next[0], next[1], next[2], 0, 0, tz) };
  }

  // HH:MM of `instant` in `tz`.
  function clock(instant, tz) {
    const p = partsIn(new Date(instant), tz);
    return pad(p.h) + ':' + pad(p.mi);
  }

  // The model's availability for 4 weeks of lab days from the lab's today.
  async function availability(model) {
    const tz = zone();
    const first = dateIn(new Date(), tz);
    const av = await call('GET', '/models/' + enc(model) + '/availability?from=' + first + '&to=' + addDays(first, 28) + '&time_zone=' + enc(tz));
    return { model: av.model, units: av.units, days: av.days, zone: tz };
  }

  // Course sessions and maintenance windows per model, fetched once per draw.
  async function holds() {
    const [courses, windows] = await Promise.all([
      call('GET', '/reservations').catch(() => []),
      call('GET', '/maintenance').catch(() => []),
    ]);
    const out = [];
    for (const r of courses || []) {
      for (const o of r.occurrences) {
        if (!o.cancelled) out.push({ kind: 'course', model: r.model, units: r.units, title: r.title, group: r.group, start: o.start, end: o.end });
      }
    }
    for (const m of windows || []) out.push({ kind: 'maintenance', model: m.model, units: m.units, title: m.reason, start: m.start, end: m.end });
    return out;
  }

  // Adds each day's course sessions and maintenance windows to the calendar grids
  // inside `box`, as text in the cell (and its title, read aloud too).
  async function mark(box) {
    let list;
    try {
      list = await holds();
    } catch (e) {
      return;
    }
    const tz = zone();
    for (const table of box.querySelectorAll('table.calendar[data-model]')) {
      const model = table.dataset.model;
      const mine = list.filter((h) => h.model === model);
      for (const cell of table.querySelectorAll('td[data-date]')) {
        const span = daySpan(cell.dataset.date, tz);
        const here = mine.filter((h) => new Date(h.start) < span.end && new Date(h.end) > span.start)
          .sort((a, b) => new Date(a.start) - new Date(b.start));
        if (!here.length) continue;
        const lines = here.map((h) => {
          const when = clock(h.start, tz) + '–' + clock(h.end, tz);
          return {
            kind: h.kind,
            short: (h.kind === 'course' ? h.title : 'maintenance') + ' ' + when,
            long: (h.kind === 'course'
              ? 'course ' + h.title + (h.group ? ' (' + h.group + ')' : '') + ' holds ' + h.units + (h.units === 1 ? ' unit' : ' units')
              : 'maintenance (' + h.title + ') blocks ' + h.units + (h.units === 1 ? ' unit' : ' units')) +
              ', ' + when + ' ' + tz,
          };
        });
        cell.classList.toggle('has-course', lines.some((l) => l.kind === 'course'));
        cell.classList.toggle('has-maintenance', lines.some((l) => l.kind === 'maintenance'));
        cell.title = cell.title + '; ' + lines.map((l) => l.long).join('; ');
        cell.append(el('span', { class: 'holds', 'aria-hidden': 'true' },
          lines.map((l) => el('span', { class: 'hold hold-' + l.kind, text: l.short }))));
        const sr = cell.querySelector('.sr-only');
        if (sr) sr.textContent = sr.textContent + '; ' + lines.map((l) => l.long).join('; ');
      }
    }
  }

  window.gpuBookingCalendar = Object.freeze({
    zone, availability, mark, zonedToUtc, dateIn, addDays, clock, partsIn,
  });
})();
