// "My notebooks" on the page (notebooks.js in the "My bookings" view): a booked
// notebook with its end, a lent one being taken back (its deadline, counting down),
// and one on CPU with the webhook's reason and a GPU offered back (PUT /offers, as
// the controller reports it), each with what to do next. The notebooks are reported
// as the controller reports them (PUT /held-units; the admin role may report too),
// with the units held it reported last, so that the demo's count stands. Leaves the
// screenshot that docs/my-notebooks.png is copied from.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {
  USER, USER_TOKEN, ADMIN_TOKEN, SHOTS, launch, newPage, api, waitReady, signInWithToken,
  contrastFailures, unlabelled,
} from './helpers.mjs';

const MINUTE = 60000;
let b;

function notebooks() {
  const now = Date.now();
  const at = (ms) => new Date(now + ms).toISOString();
  return [
    { user: USER, namespace: 'jhub', pod: 'jupyter-alice', standing: 'booked', model: 'a100', gpus: 1,
      booking_id: 1, why: 'booked: your booking 1 gives it its GPU until it ends',
      ends_at: at(26 * 60 * MINUTE), last_activity: at(-3 * MINUTE), started: at(-90 * MINUTE),
      next: ['extend'] },
    { user: USER, namespace: 'jhub', pod: 'jupyter-alice--train', standing: 'lent', model: 'a6000', gpus: 1,
      why: 'lent without a booking, and a booked user needs this GPU: save your work, it is taken back at the time shown',
      taken_back_at: at(2 * MINUTE), last_activity: at(-40 * MINUTE), started: at(-5 * 60 * MINUTE),
      next: ['book'] },
    { user: USER, namespace: 'jhub', pod: 'jupyter-alice--cpu', standing: 'stripped', gpus: 0,
      why: 'on CPU: no free a100 GPU and no active booking', started: at(-10 * MINUTE),
      next: ['book'] },
  ];
}

// The a100 offered back to the user for their notebook on CPU, held 5 minutes.
function offers() {
  const now = Date.now();
  return [{ user: USER, model: 'a100', units: 1, namespace: 'jhub', pod: 'jupyter-alice--cpu',
    offered_at: new Date(now).toISOString(), until: new Date(now + 5 * MINUTE).toISOString() }];
}

// With the units held the controller last reported, so that the report changes only
// the notebooks; the offer as the controller reports it (its next report replaces
// it, hence the retries below).
async function report() {
  const state = await api('GET', '/admission-state?full=false', ADMIN_TOKEN);
  await api('PUT', '/held-units', ADMIN_TOKEN, { bookings: state.held || {}, notebooks: notebooks() });
  await api('PUT', '/offers', ADMIN_TOKEN, { offers: offers() });
}

describe('my notebooks', () => {
  before(async () => {
    await waitReady();
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
  });

  it('shows each notebook, why, until when, and what to do next', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    // The demo's controller reports its own list on its next change: report again
    // until the card shows this one.
    let shown = false;
    for (let i = 0; i < 10 && !shown; i++) {
      await report();
      await page.evaluate(() => { location.hash = '#book'; });
      await page.evaluate(() => { location.hash = '#mine'; });
      shown = await page.locator('#nb-list li.nb-stripped .nb-offer').waitFor({ timeout: 2000 })
        .then(() => true, () => false);
    }
    assert.ok(shown, 'the three notebooks are listed, one with an offer');
    const items = page.locator('#nb-list li.nb');
    assert.equal(await items.count(), 3);

    const booked = page.locator('li.nb-booked');
    assert.match(await booked.locator('.nb-standing').innerText(), /Booked GPU/);
    assert.match(await booked.innerText(), /a100/);
    assert.match(await booked.innerText(), /GPU until/);
    assert.match(await booked.innerText(), /Last GPU activity 3 min ago/);
    await booked.getByRole('button', { name: 'Extend booking 1' }).waitFor();

    const lent = page.locator('li.nb-lent');
    assert.match(await lent.locator('.nb-standing').innerText(), /Lent GPU/);
    assert.match(await lent.locator('.nb-deadline').innerText(), /Taken back at .*\(in [12] min \d\d s\)/);
    // Counting down each second.
    const before = await lent.locator('.nb-countdown').innerText();
    await page.waitForFunction((b) => document.querySelector('li.nb-lent .nb-countdown').textContent !== b, before);
    assert.match(await lent.innerText(), /save your work/);

    const cpu = page.locator('li.nb-stripped');
    assert.match(await cpu.locator('.nb-standing').innerText(), /On CPU/);
    assert.match(await cpu.locator('.nb-why').innerText(), /no free a100 GPU and no active booking/);
    await cpu.getByRole('button', { name: 'Book a GPU' }).waitFor();
    const offer = cpu.locator('.nb-offer');
    assert.match(await offer.innerText(),
      /One a100 GPU is held for you: restart your server to get it \(until .*, in [45] min \d\d s\)/);
    // What to do next comes first: the offer.
    assert.equal(await cpu.locator('.nb-next > *').first().getAttribute('data-step'), 'restart');

    // Book: the booking form, on the notebook's model.
    await lent.getByRole('button', { name: 'Book a6000' }).click();
    await page.locator('#view-book').waitFor();
    assert.equal(await page.locator('#book-model').inputValue(), 'a6000');
    await page.evaluate(() => { location.hash = '#mine'; });
    await page.locator('li.nb-lent').waitFor();

    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    assert.deepEqual(await contrastFailures(page), [], 'text contrast is at least 4.5:1');
    await page.locator('#notebooks').screenshot({ path: path.join(SHOTS, 'my-notebooks.png') });
    page.assertClean();
  });

  it('shows only the signed-in user\'s notebooks', async () => {
    await report();
    const mine = await api('GET', '/notebooks', USER_TOKEN);
    assert.ok(mine.notebooks.every((n) => n.user === USER));
    await assert.rejects(api('GET', '/notebooks?user=admin@example.com', USER_TOKEN), /403/);
  });
});
