// Booked versus used on the Admin view (usage.js with the vendored Chart.js): an
// admin sees the plot drawn from the API's report (a canvas with Chart.js's chart on
// it, its bars the report's rows) and the no-show and idle tables; per group, each
// group's use against its quota, a user in two groups counted for the first in the
// admin's order only; a user sees no Admin view and the API refuses them the report.
// Leaves the screenshot that docs/usage.png is copied from; deletes its groups and
// booking at the end.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  USER_TOKEN, ADMIN_TOKEN, BASE, api, ceilMinute, launch, newPage, shot, waitReady, signInWithToken, unlabelled,
} from './helpers.mjs';

// A student in two groups: usage-ml comes first in the admin's order, so their
// booking counts against it, not against usage-vision.
const STUDENT = 'usage.student@uni.example';
const GROUPS = [
  { name: 'usage-ml', position: 100, quota: { gpu_hours: 500, units: 4 } },
  { name: 'usage-vision', position: 101, quota: { gpu_hours: 100 } },
];

let b;
let booking;

describe('usage report', () => {
  before(async () => {
    await waitReady();
    b = await launch();
    for (const g of GROUPS) {
      await api('POST', '/groups', ADMIN_TOKEN, g);
      await api('PUT', `/groups/${g.name}/members/${encodeURIComponent(STUDENT)}`, ADMIN_TOKEN, {});
    }
    // The lab's shortest booking (a day), starting in two minutes.
    const start = ceilMinute(Date.now() + 120000);
    booking = await api('POST', '/bookings', ADMIN_TOKEN, {
      model: 'a6000', user: STUDENT, start: start.toISOString(),
      end: new Date(start.getTime() + 86400000).toISOString(),
    });
  });

  after(async () => {
    if (booking) await fetch(`${BASE}/api/v1/bookings/${booking.id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
    for (const g of GROUPS) {
      await fetch(`${BASE}/api/v1/groups/${g.name}`, { method: 'DELETE', headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
    }
    if (b) await b.close();
  });

  it('shows an admin the plot of booked, held and active GPU-hours', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.goto(page.url().replace(/#.*$/, '') + '#admin-usage');
    await page.locator('#au-title', { hasText: 'Booked versus used' }).waitFor();
    await page.waitForFunction(() => window.gpuBookingUsage && window.gpuBookingUsage.loads > 0);
    assert.equal(await page.locator('#au-problem').isHidden(), true);

    // The chart is Chart.js's, on the canvas, with the report's rows as its bars.
    const drawn = await page.evaluate(() => {
      const canvas = document.getElementById('au-chart');
      const chart = window.Chart && window.Chart.getChart(canvas);
      const report = window.gpuBookingUsage.report;
      return {
        canvas: !!canvas && canvas.width > 0 && canvas.height > 0,
        labels: chart ? chart.data.labels : null,
        series: chart ? chart.data.datasets.map((d) => d.label) : null,
        booked: chart ? chart.data.datasets[0].data : null,
        keys: report.rows.map((r) => r.key),
        reportBooked: report.rows.map((r) => r.booked_gpu_hours),
        bookings: report.total.bookings,
      };
    });
    assert.ok(drawn.canvas, 'a canvas with a size');
    assert.ok(drawn.bookings > 0, 'the demo\'s bookings are in the report');
    assert.deepEqual(drawn.labels, drawn.keys);
    assert.deepEqual(drawn.series, ['Booked', 'Held by a pod', 'GPU active']);
    assert.deepEqual(drawn.booked, drawn.reportBooked);
    assert.ok(drawn.booked.some((h) => h > 0), 'something was booked');
    // The canvas says in words what it shows.
    assert.match(await page.locator('#au-chart').getAttribute('aria-label'), /GPU-hours booked, held and active per user: /);
    assert.match(await page.locator('#au-summary').innerText(), /bookings?: .* booked, .* held by a pod/);
    await page.locator('#au-noshows-title').waitFor();
    await page.locator('#au-idle-title').waitFor();

    // Per model: the plot follows.
    await page.getByLabel('Per', { exact: true }).selectOption('model');
    await page.getByRole('button', { name: 'Show', exact: true }).click();
    await page.waitForFunction(() => window.gpuBookingUsage.report.by === 'model');
    const models = await page.evaluate(() => window.Chart.getChart(document.getElementById('au-chart')).data.labels);
    assert.ok(models.length > 0);
    assert.deepEqual(await unlabelled(page), []);

    // The CSV download carries the header row.
    const csv = async () => {
      const [download] = await Promise.all([
        page.waitForEvent('download'),
        page.getByRole('button', { name: 'Download CSV' }).click(),
      ]);
      return (await import('node:fs')).readFileSync(await download.path(), 'utf8');
    };
    assert.match(await csv(), /^model,bookings,booked_gpu_hours,held_gpu_hours,active_gpu_hours,no_shows,idle\r\n/);

    // Per group: a bar a group, and a line each of use against quota.
    await page.getByLabel('Per', { exact: true }).selectOption('group');
    await page.getByRole('button', { name: 'Show', exact: true }).click();
    await page.waitForFunction(() => window.gpuBookingUsage.report.by === 'group');
    const grouped = await page.evaluate(() => ({
      labels: window.Chart.getChart(document.getElementById('au-chart')).data.labels,
      rows: window.gpuBookingUsage.report.rows,
    }));
    assert.deepEqual(grouped.labels, grouped.rows.map((r) => (r.key === '' ? '(no group)' : r.key)));
    const ml = grouped.rows.find((r) => r.key === 'usage-ml');
    const vision = grouped.rows.find((r) => r.key === 'usage-vision');
    assert.ok(ml && vision, 'a row for every group, one without bookings too');
    assert.ok(ml.quota_use.by_user[STUDENT] > 0, 'the student\'s hours count for usage-ml');
    assert.equal(vision.quota_use.by_user[STUDENT], undefined, '... and not for usage-vision');
    assert.equal(vision.bookings, 0);
    const u = ml.quota_use;
    const n = (x) => Number(x).toLocaleString('en-GB', { maximumFractionDigits: 1 });
    const line = page.locator('#au-quota li[data-group="usage-ml"]');
    assert.equal(await line.locator('.quota-text').innerText(),
      `usage-ml: ${n(u.used_gpu_hours)} of 500 GPU-hours in ${u.period} (${n(u.left_gpu_hours)} left) · ${u.units_now} of 4 GPUs held`);
    assert.equal(await line.locator('meter').getAttribute('max'), '500');
    assert.match(await page.locator('#au-quota li[data-group="usage-vision"] .quota-text').innerText(),
      new RegExp(`^usage-vision: 0 of 100 GPU-hours in ${u.period} \\(100 left\\)$`));
    assert.match(await page.locator('#au-chart').getAttribute('aria-label'), /per group: .*usage-ml /);
    assert.deepEqual(await unlabelled(page), []);
    await page.locator('#admin-usage').scrollIntoViewIfNeeded();
    await shot(page, 'usage.png', false);
    assert.match(await csv(), /^group,bookings,booked_gpu_hours,held_gpu_hours,active_gpu_hours,no_shows,idle,quota_period,quota_period_start,quota_period_end,quota_gpu_hours,quota_used_gpu_hours,quota_left_gpu_hours,quota_units,quota_units_now\r\n/);
    page.assertClean();
  });

  it('shows a user no admin view, and the API refuses them the report', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    await page.goto(page.url().replace(/#.*$/, '') + '#admin-usage');
    await page.locator('#view-book').waitFor();
    assert.equal(await page.locator('#tab-admin').isHidden(), true);
    assert.equal(await page.locator('#view-admin').isHidden(), true);
    assert.equal(await page.evaluate(() => window.gpuBookingUsage.loads), 0, 'no report loaded');
    const res = await fetch(`${BASE}/api/v1/admin/usage`, { headers: { Authorization: `Bearer ${USER_TOKEN}` } });
    assert.equal(res.status, 403);
    page.assertClean();
  });
});
