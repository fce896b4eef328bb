// Booked versus used on the Admin view: GPU-hours booked, held and
// active per user, model or group over a period, plotted with Chart.js (vendored in
// /assets/chart.umd.min.js); per group, each group's use against its quota as the
// report gives it (`quota_use`: the API counts it, this only shows it); the
// no-shows and the idle bookings as tables; the same report as CSV. Only the REST API is called (GET /api/v1/admin/usage), with
// the token app.js keeps for this tab (none behind a sign-in proxy); the API
// answers 403 to anyone but an admin, and app.js shows this view to admins only.
'use strict';

(function () {
  const API = '/api/v1';
  const TOKEN_KEY = 'gpu-booking-token';
  const DAY_MS = 86400000;
  const $ = (id) => document.getElementById(id);
  const { el } = window.gpuBookingDom;

  // What the test (and a curious admin's console) can read: the last report and
  // its chart.
  const exposed = { report: null, chart: null, loads: 0 };
  window.gpuBookingUsage = exposed;

  function headers(accept) {
    const h = { Accept: accept };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) h.Authorization = 'Bearer ' + token;
    return h;
  }

  function dateValue(d) {
    const p = (n) => String(n).padStart(2, '0');
    return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate());
  }

  // The form's period as a query: local midnights, the "to" day included.
  function query(format) {
    const [fy, fm, fd] = $('au-from').value.split('-').map(Number);
    const [ty, tm, td] = $('au-to').value.split('-').map(Number);
    const from = new Date(fy, fm - 1, fd);
    const to = new Date(ty, tm - 1, td + 1);
    const q = new URLSearchParams({
      from: from.toISOString(), to: to.toISOString(), by: $('au-by').value,
      idle_hours: $('au-idle').value || '4', format,
    });
    return q.toString();
  }

  async function fetchReport(format) {
    const res = await fetch(API + '/admin/usage?' + query(format), {
      headers: headers(format === 'csv' ? 'text/csv' : 'application/json'), credentials: 'same-origin',
    });
    if (!res.ok) {
      const data = await res.json().catch(() => null);
      throw new Error((data && data.message) || ('HTTP ' + res.status));
    }
    return format === 'csv' ? res.blob() : res.json();
  }

  function fmtTime(t) {
    return t ? new Date(t).toLocaleString(undefined, {
      day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit',
    }) : '—';
  }

  function hours(h) {
    return (Math.round(h * 10) / 10).toLocaleString() + ' h';
  }

  function num(n) {
    return Number(n).toLocaleString(undefined, { maximumFractionDigits: 1 });
  }

  // A row's name on the chart: per group, the bookings of no group have the empty key.
  function label(report, row) {
    return report.by === 'group' && row.key === '' ? '(no group)' : row.key;
  }

  // A group's use against its quota in words: "ml-lab: 120 of 500 GPU-hours in
  // 2026-12 (380 left) · 2 of 4 GPUs held". The figures are for the quota period
  // holding the report's last instant, and the GPUs held at that instant.
  function quotaText(name, u) {
    const q = u.quota || {};
    const limited = q.gpu_hours !== null && q.gpu_hours !== undefined;
    let text = name + ': ';
    if (!limited) text += num(u.used_gpu_hours) + ' GPU-hours' + (u.period ? ' in ' + u.period : '') + ', no hours quota';
    else if (!u.period) text += 'GPU-hours not limited then (no term runs)';
    else text += `${num(u.used_gpu_hours)} of ${num(q.gpu_hours)} GPU-hours in ${u.period} (${num(u.left_gpu_hours)} left)`;
    if (q.units !== null && q.units !== undefined) text += ` · ${u.units_now} of ${q.units} GPUs held`;
    return text;
  }

  // Per group: a line each of use against quota, with a meter of the hours used.
  function quotaList(report) {
    const rows = report.by === 'group' ? report.rows.filter((r) => r.quota_use) : [];
    if (!rows.length) return [];
    return [
      el('h4', { id: 'au-quota-title', text: 'Use against quota (the period holding the report\'s end)' }),
      el('ul', { class: 'quota-use', 'aria-labelledby': 'au-quota-title' }, rows.map((r) => {
        const u = r.quota_use;
        const limit = u.quota && u.quota.gpu_hours;
        return el('li', { 'data-group': r.key },
          el('span', { class: 'quota-text', text: quotaText(r.key, u) }),
          ' ',
          limit && u.period ? el('meter', {
            min: '0', max: String(limit), high: String(limit * 0.9), value: String(Math.min(u.used_gpu_hours, limit)),
            'aria-hidden': 'true',
          }) : null);
      })),
    ];
  }

  function table(rows, caption, empty) {
    if (!rows.length) return el('p', { class: 'muted', text: empty });
    return el('div', { class: 'table-scroll' }, el('table', { class: 'bookings usage' },
      el('caption', { class: 'sr-only', text: caption }),
      el('thead', null, el('tr', null,
        ['Booking', 'User', 'Model', 'GPUs', 'Window', 'Booked', 'Held', 'Active', 'Last active', 'Idle since']
          .map((h) => el('th', { scope: 'col', text: h })))),
      el('tbody', null, rows.map((b) => el('tr', { 'data-booking': String(b.id) },
        el('td', { 'data-label': 'Booking', text: '#' + b.id }),
        el('td', { 'data-label': 'User', text: b.user }),
        el('td', { 'data-label': 'Model', text: b.model }),
        el('td', { 'data-label': 'GPUs', text: String(b.units) }),
        el('td', { 'data-label': 'Window', text: fmtTime(b.start) + ' – ' + fmtTime(b.end) }),
        el('td', { 'data-label': 'Booked', text: hours(b.booked_gpu_hours) }),
        el('td', { 'data-label': 'Held', text: hours(b.held_gpu_hours) }),
        el('td', { 'data-label': 'Active', text: hours(b.active_gpu_hours) }),
        el('td', { 'data-label': 'Last active', text: fmtTime(b.last_active) }),
        el('td', { 'data-label': 'Idle since', text: fmtTime(b.idle_since) }),
      )))));
  }

  // Colours with enough contrast on white, told apart by more than hue (the
  // active bars are solid, the others lighter).
  const SERIES = [
    ['booked_gpu_hours', 'Booked', 'rgba(90, 110, 140, 0.45)', 'rgb(60, 75, 100)'],
    ['held_gpu_hours', 'Held by a pod', 'rgba(31, 119, 180, 0.6)', 'rgb(20, 80, 130)'],
    ['active_gpu_hours', 'GPU active', 'rgb(214, 95, 0)', 'rgb(150, 60, 0)'],
  ];

  function plot(report) {
    const labels = report.rows.map((r) => label(report, r));
    const datasets = SERIES.map(([key, label, bg, border]) => ({
      label, data: report.rows.map((r) => r[key]), backgroundColor: bg, borderColor: border, borderWidth: 1,
    }));
    if (exposed.chart) {
      exposed.chart.data.labels = labels;
      exposed.chart.data.datasets = datasets;
      exposed.chart.update();
      return;
    }
    exposed.chart = new window.Chart($('au-chart'), {
      type: 'bar',
      data: { labels, datasets },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: { y: { beginAtZero: true, title: { display: true, text: 'GPU-hours' } } },
        plugins: { legend: { position: 'bottom' } },
      },
    });
  }

  async function load() {
    $('au-problem').hidden = true;
    try {
      const report = await fetchReport('json');
      exposed.report = report;
      if (window.Chart) plot(report);
      const t = report.total;
      $('au-summary').textContent = `${t.bookings} ${t.bookings === 1 ? 'booking' : 'bookings'}: ${hours(t.booked_gpu_hours)} booked, `
        + `${hours(t.held_gpu_hours)} held by a pod, ${hours(t.active_gpu_hours)} with the GPU active; `
        + `${t.no_shows} no-shows, ${t.idle} idle now.`;
      $('au-chart').setAttribute('aria-label', 'GPU-hours booked, held and active per ' + report.by + ': '
        + report.rows.map((r) => `${label(report, r)} ${hours(r.booked_gpu_hours)} booked, ${hours(r.held_gpu_hours)} held, ${hours(r.active_gpu_hours)} active`).join('; '));
      $('au-quota').replaceChildren(...quotaList(report));
      $('au-noshows').replaceChildren(table(report.no_shows, 'No-shows', 'No no-shows in this period.'));
      $('au-idlelist').replaceChildren(table(report.idle, 'Idle bookings', 'No booking is idle now.'));
      exposed.loads += 1;
    } catch (e) {
      $('au-problem').textContent = 'The usage report could not be loaded: ' + e.message;
      $('au-problem').hidden = false;
    }
  }

  async function downloadCsv() {
    try {
      const blob = await fetchReport('csv');
      const url = URL.createObjectURL(blob);
      const a = el('a', { href: url, download: `gpu-usage-${$('au-from').value}-${$('au-to').value}.csv` });
      document.body.append(a);
      a.click();
      a.remove();
      window.setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      $('au-problem').textContent = 'The CSV could not be made: ' + e.message;
      $('au-problem').hidden = false;
    }
  }

  let wired = false;
  function shown() {
    if (!wired) {
      wired = true;
      const today = new Date();
      $('au-to').value = dateValue(today);
      $('au-from').value = dateValue(new Date(today.getTime() - 29 * DAY_MS));
      $('au-filter').addEventListener('submit', (e) => { e.preventDefault(); load(); });
      $('au-csv').addEventListener('click', downloadCsv);
    }
    load();
  }

  // app.js shows and hides the views (and shows Admin to admins only); load
  // whenever the Admin view is shown.
  function watch() {
    const view = $('view-admin');
    if (!view) return;
    const check = () => { if (!view.hidden) shown(); };
    new MutationObserver(check).observe(view, { attributes: true, attributeFilter: ['hidden'] });
    check();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', watch);
  else watch();
})();
