// The booking calendar's days in the lab's time zone (the server's
// `gpu-booking-time-zone`; UTC where it names none), with the course sessions and
// maintenance windows of each day. The API answers free units per UTC day; a lab
// day overlaps one to three of them, and the units free for the whole lab day are at
// least the fewest free on those (exact where the lab's zone is UTC). app.js draws
// the grid from availability() and calls mark() on it.
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

  // The UTC days' availability as the lab's days: from the lab's today, `count`
  // days; each lab day free for the fewest units free on a UTC day it overlaps.
  function labDays(utcDays, first, count, tz) {
    const byDate = new Map(utcDays.map((d) => [d.date, d]));
    const out = [];
    for (let i = 0; i < count; i++) {
      const date = addDays(first, i);
      const span = daySpan(date, tz);
      let free = Infinity;
      let booked = 0;
      let seen = false;
      const last = new Date(span.end.getTime() - 1).toISOString().slice(0, 10);
      for (let u = span.start.toISOString().slice(0, 10); u <= last; u = addDays(u, 1)) {
        const d = byDate.get(u);
        if (!d) continue;
        seen = true;
        free = Math.min(free, d.free);
        booked = Math.max(booked, d.booked);
      }
      if (seen) out.push({ date, free, booked });
    }
    return out;
  }

  // The model's availability for 4 weeks of lab days, shaped as the API's answer.
  async function availability(model) {
    const tz = zone();
    const first = dateIn(new Date(), tz);
    const count = 28;
    const av = await call('GET', '/models/' + enc(model) + '/availability?from=' + addDays(first, -1) + '&to=' + addDays(first, count + 1));
    return { model: av.model, units: av.units, days: labDays(av.days, first, count, tz), zone: tz };
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
