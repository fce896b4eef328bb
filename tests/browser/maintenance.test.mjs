// Maintenance windows on the Admin view (maintenance.js) and in the booking
// calendar (calendar.js), against `gpu-booking demo`: a window over two bookings is
// answered with them and changes nothing; the admin's choice for each (shorten the
// one that starts before the window, cancel the one inside it) and confirmation
// resolve them and block the units; the calendar shows the window; a refusal is in
// the API's words; deleting the window frees the units. Leaves the screenshot that
// docs/maintenance.png is copied from; removes what it made.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  ADMIN_TOKEN, DAY_MS, launch, newPage, shot, api, waitReady, signInWithToken, localInput, unlabelled,
  contrastFailures,
} from './helpers.mjs';
import { answer } from './course-helpers.mjs';

const HOUR = 3600000;
const REASON = 'driver upgrade';
let b;
const s = {};

describe('maintenance windows', () => {
  before(async () => {
    await waitReady();
    b = await launch();
    // The window: 10:00 to 16:00 UTC, 20 days ahead (in the calendar's 4 weeks).
    const d = new Date(Date.now() + 20 * DAY_MS);
    s.start = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate(), 10));
    s.end = new Date(s.start.getTime() + 6 * HOUR);
    const book = (user, start, end) => api('POST', '/bookings', ADMIN_TOKEN, {
      user, model: 'a6000', start: start.toISOString(), end: end.toISOString(), override: true,
    });
    s.across = await book('maint.across@uni.example', new Date(s.start.getTime() - DAY_MS), new Date(s.start.getTime() + DAY_MS));
    s.inside = await book('maint.inside@uni.example', new Date(s.start.getTime() + 2 * HOUR), new Date(s.start.getTime() + 4 * HOUR));
  });

  after(async () => {
    for (const m of await api('GET', '/maintenance', ADMIN_TOKEN)) {
      if (m.reason === REASON) await answer('DELETE', `/maintenance/${m.id}`, ADMIN_TOKEN);
    }
    for (const x of [s.across, s.inside]) if (x) await answer('DELETE', `/bookings/${x.id}`, ADMIN_TOKEN);
    if (b) await b.close();
  });

  it('lists the bookings in the way, changes nothing, then resolves them as the admin confirms', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.goto(page.url().replace(/#.*$/, '') + '#admin-maintenance');
    const form = page.locator('#mt-form');
    await form.getByLabel('GPU model').locator('option[value="a6000"]').waitFor({ state: 'attached' });
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');

    // A refusal in the API's words: more units than the model has.
    const tooMany = { model: 'a6000', units: 9, start: s.start.toISOString(), end: s.end.toISOString(), reason: REASON };
    const refused = await answer('POST', '/maintenance', ADMIN_TOKEN, tooMany);
    assert.ok(refused.status >= 400 && refused.status < 500 && refused.status !== 409, JSON.stringify(refused));
    await form.getByLabel('GPU model').selectOption('a6000');
    await form.getByLabel(/^Units/).fill('9');
    await form.getByLabel(/^Start/).fill(localInput(s.start));
    await form.getByLabel(/^End/).fill(localInput(s.end));
    await form.getByLabel(/^Reason/).fill(REASON);
    await page.getByRole('button', { name: 'Block these units' }).click();
    const problem = page.locator('#mt-result .notice.error');
    await problem.waitFor();
    assert.match(await problem.innerText(), /^Not blocked\./);
    assert.equal(await problem.locator('q').innerText(), refused.body.message);

    // Every unit: both bookings are in the way, and nothing changes yet.
    await form.getByLabel(/^Units/).fill('');
    await page.getByRole('button', { name: 'Block these units' }).click();
    const way = page.locator('#mt-in-the-way');
    await way.waitFor();
    assert.match(await way.innerText(), /Nothing was changed yet\. 2 bookings hold units this window needs\. Choose what happens to each, then confirm\./);
    assert.equal(await way.locator(`tr[data-booking="${s.across.id}"] select`).inputValue(), 'shorten');
    assert.equal(await way.locator(`tr[data-booking="${s.inside.id}"] select`).inputValue(), 'cancel');
    assert.match(await way.locator(`tr[data-booking="${s.across.id}"]`).innerText(), /maint\.across@uni\.example/);
    assert.equal((await api('GET', `/bookings/${s.across.id}`, ADMIN_TOKEN)).end, s.across.end, 'not shortened yet');
    assert.equal((await api('GET', `/bookings/${s.inside.id}`, ADMIN_TOKEN)).status, 'planned', 'not cancelled yet');
    assert.equal((await api('GET', '/maintenance', ADMIN_TOKEN)).filter((m) => m.reason === REASON).length, 0, 'no window yet');
    assert.deepEqual(await contrastFailures(page), [], 'every text has enough contrast');
    await way.scrollIntoViewIfNeeded();
    await shot(page, 'maintenance-01-in-the-way.png', false);

    await way.getByRole('button', { name: 'Change these bookings and block the units' }).click();
    await page.locator('#mt-ok').waitFor();
    assert.match(await page.locator('#mt-ok').innerText(), /^Blocked: 4 units of a6000 from .* \(driver upgrade\)\. The bookings in the way were changed as chosen\./);
    const across = await api('GET', `/bookings/${s.across.id}`, ADMIN_TOKEN);
    assert.equal(new Date(across.end).getTime(), s.start.getTime(), 'shortened to the window\'s start');
    assert.equal((await api('GET', `/bookings/${s.inside.id}`, ADMIN_TOKEN)).status, 'cancelled');
    const windows = (await api('GET', '/maintenance', ADMIN_TOKEN)).filter((m) => m.reason === REASON);
    assert.equal(windows.length, 1);
    assert.equal(windows[0].units, 4);
    assert.equal(new Date(windows[0].start).getTime(), s.start.getTime());
    s.window = windows[0];
    const row = page.locator(`#mt-list tr[data-id="${s.window.id}"]`);
    await row.waitFor();
    assert.match(await row.innerText(), /a6000\s+4\s+.*driver upgrade/);

    // A booking in the window is refused (the API's words are its own: see the
    // booking form's tests).
    const booking = await answer('POST', '/bookings', ADMIN_TOKEN, {
      user: 'maint.late@uni.example', model: 'a6000', start: s.start.toISOString(), end: new Date(s.start.getTime() + DAY_MS).toISOString(),
    });
    assert.equal(booking.status, 409, JSON.stringify(booking));
    assert.ok(['maintenance', 'capacity'].includes(booking.body.error), JSON.stringify(booking.body));

    // The calendar shows it on its day, with no unit free.
    const day = s.start.toISOString().slice(0, 10);
    await page.locator('#tabs a[data-view="book"]').click();
    const cell = page.locator(`table.calendar[data-model="a6000"] td[data-date="${day}"]`);
    await cell.locator('.hold-maintenance').waitFor();
    assert.equal(await cell.locator('.hold-maintenance').innerText(), 'maintenance 10:00–16:00');
    assert.equal(await cell.getAttribute('data-free'), '0');
    assert.match(await cell.getAttribute('title'), /maintenance \(driver upgrade\) blocks 4 units, 10:00–16:00 UTC/);
    page.assertClean();
    await page.context().close();
  });

  it('deleting the window frees its units', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.goto(page.url().replace(/#.*$/, '') + '#admin-maintenance');
    const row = page.locator(`#mt-list tr[data-id="${s.window.id}"]`);
    await row.getByRole('button', { name: /^Delete/ }).click();
    assert.match(await page.locator('#confirm-text').innerText(), /a6000 \(driver upgrade\)/);
    await page.locator('#confirm-yes').click();
    await page.locator('#mt-result .notice.ok', { hasText: 'Deleted the maintenance window of a6000.' }).waitFor();
    await row.waitFor({ state: 'detached' });
    assert.equal((await api('GET', '/maintenance', ADMIN_TOKEN)).filter((m) => m.reason === REASON).length, 0);
    const day = s.start.toISOString().slice(0, 10);
    await page.locator('#tabs a[data-view="book"]').click();
    await page.locator(`table.calendar[data-model="a6000"] td[data-date="${day}"]:not(.has-maintenance)`).waitFor();
    assert.notEqual(await page.locator(`table.calendar[data-model="a6000"] td[data-date="${day}"]`).getAttribute('data-free'), '0');
    page.assertClean();
    await page.context().close();
  });
});
