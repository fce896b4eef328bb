// Booked versus used on the Admin view (usage.js with the vendored Chart.js): an
// admin sees the plot drawn from the API's report (a canvas with Chart.js's chart on
// it, its bars the report's rows) and the no-show and idle tables; a user sees no
// Admin view and the API refuses them the report. Leaves the screenshot that
// docs/usage.png is copied from.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  USER_TOKEN, ADMIN_TOKEN, BASE, launch, newPage, shot, waitReady, signInWithToken, unlabelled,
} from './helpers.mjs';

let b;

describe('usage report', () => {
  before(async () => {
    await waitReady();
    b = await launch();
  });

  after(async () => {
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
    await page.locator('#admin-usage').scrollIntoViewIfNeeded();
    await shot(page, 'usage.png', false);

    // The CSV download carries the header row.
    const [download] = await Promise.all([
      page.waitForEvent('download'),
      page.getByRole('button', { name: 'Download CSV' }).click(),
    ]);
    const path = await download.path();
    const text = (await import('node:fs')).readFileSync(path, 'utf8');
    assert.match(text, /^model,bookings,booked_gpu_hours,held_gpu_hours,active_gpu_hours,no_shows,idle\r\n/);
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
