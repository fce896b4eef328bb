// The "Change the end of a booking" control on My bookings (extend.js): the admin
// books for themselves far ahead (no other test's booking is there), extends it on
// the page, and a refused change shows the service's reason and changes nothing.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BASE, ADMIN_TOKEN, ADMIN, DAY_MS, launch, newPage, shot, api, waitReady, localInput,
  signInWithToken, unlabelled,
} from './helpers.mjs';

let b;

describe('change the end of a booking', () => {
  before(async () => {
    await waitReady();
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
  });

  it('extends a planned booking, and shows why a change is refused', async () => {
    const models = await api('GET', '/models', ADMIN_TOKEN);
    const model = models[models.length - 1].name;
    const start = new Date(Math.ceil((Date.now() + 300 * DAY_MS) / 3600000) * 3600000);
    const end = new Date(start.getTime() + 2 * DAY_MS);
    const booking = await api('POST', '/bookings', ADMIN_TOKEN,
      { model, user: ADMIN, start: start.toISOString(), end: end.toISOString(), override: true });

    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.goto(`${BASE}/#mine`);
    const card = page.locator('#extend-card');
    await card.waitFor();
    await page.locator('#extend-booking').selectOption(String(booking.id));
    const later = new Date(end.getTime() + DAY_MS);
    await page.getByLabel('New end').fill(localInput(later));
    await page.getByRole('button', { name: 'Change end' }).click();
    await page.locator('#extend-result', { hasText: `Booking #${booking.id} now ends` }).waitFor();
    const after1 = await api('GET', `/bookings/${booking.id}`, ADMIN_TOKEN);
    assert.equal(new Date(after1.end).getTime(), later.getTime());
    await shot(page, 'extend-booking.png');

    // Past the policy's maximum duration: refused with the service's words.
    await page.locator('#extend-booking').selectOption(String(booking.id));
    await page.getByLabel('New end').fill(localInput(new Date(start.getTime() + 30 * DAY_MS)));
    await page.getByRole('button', { name: 'Change end' }).click();
    await page.locator('#extend-result', { hasText: 'at most' }).waitFor();
    const after2 = await api('GET', `/bookings/${booking.id}`, ADMIN_TOKEN);
    assert.equal(after2.end, after1.end, 'a refused change changed nothing');
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    page.assertClean();
    await api('DELETE', `/bookings/${booking.id}`, ADMIN_TOKEN);
    await page.context().close();
  });
});
