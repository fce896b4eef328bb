// Multi-GPU bookings on the booking page: the demo's policy allows bookings of up
// to 2 GPUs, so the booking form shows a "GPUs" field (units.js) and the booking
// made is for the GPUs chosen. Runs after the other files (the demo is shared):
// it books as the admin, whom they do not book for.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BASE, ADMIN_TOKEN, DAY_MS, launch, newPage, shot, api, waitReady, localInput, ceilMinute,
  signInWithToken, unlabelled,
} from './helpers.mjs';

let b;

describe('multi-GPU bookings', () => {
  before(async () => {
    await waitReady();
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
  });

  it('the form offers the policy\'s GPUs and books that many', async () => {
    const policy = await api('GET', '/policy', ADMIN_TOKEN);
    assert.equal(policy.max_units_per_booking, 2, 'the demo allows 2-GPU bookings');
    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.goto(`${BASE}/#book`);
    const gpus = page.getByLabel('GPUs (1 to 2)');
    await gpus.waitFor();
    assert.equal(await gpus.inputValue(), '1');
    assert.equal(await gpus.getAttribute('max'), '2');
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');

    // The earliest start for a100 (now: both are booked or held) is held back until
    // the start is typed: an answer that arrives after the user chose a start must not
    // overwrite it (CI once booked "now" that way, and was refused).
    let release;
    const held = new Promise((resolve) => { release = resolve; });
    const a100NextStart = (url) => url.pathname.endsWith('/me/next-start') && url.searchParams.get('model') === 'a100';
    await page.route(a100NextStart, async (route) => { await held; await route.continue(); });
    await page.locator('#book-form').getByLabel('GPU model').selectOption('a100');
    await gpus.fill('2');
    const start = ceilMinute(new Date(Date.now() + 40 * DAY_MS));
    await page.locator('#book-form').getByLabel(/^Start/).fill(localInput(start));
    release();
    // The box said "Finding the earliest start…" since the model changed.
    await page.locator('#book-earliest', { hasText: 'Earliest start:' }).waitFor();
    assert.equal(await page.locator('#book-form').getByLabel(/^Start/).inputValue(), localInput(start),
      'the typed start stays when the earliest start arrives');
    await page.unroute(a100NextStart);
    await page.getByRole('button', { name: 'Book', exact: true }).click();
    const result = page.locator('#book-ok, #book-result .refusal');
    await result.first().waitFor();
    assert.equal(await page.locator('#book-ok').count(), 1, `booked: ${await page.locator('#book-result').innerText()}`);
    await shot(page, 'units-01-two-gpu-booking.png');
    const mine = await api('GET', '/bookings', ADMIN_TOKEN);
    const made = mine.find((x) => x.model === 'a100' && x.status === 'planned');
    assert.ok(made, `a planned a100 booking: ${JSON.stringify(mine)}`);
    assert.equal(made.units, 2);
    assert.equal(made.slots.length, 2);
    page.assertClean();
    await page.context().close();
  });
});
