// Other workloads on the booking page: the cards that pods of other workloads hold
// (a model's `others_in_use` and `other_namespaces`), the admins' warning when the
// declared units exceed what bookings can get (`over_declared`), and why a running
// booking's pod waits (a booking's `waiting`). The demo's controller reports its own
// counts at any moment, so the answers are the API's own with those fields set here
// (the API's tests cover how they are recorded: booking-api/tests/it/other_workloads.rs).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BASE, ADMIN, ADMIN_TOKEN, DAY_MS, launch, newPage, shot, waitReady, signInWithToken,
  contrastFailures,
} from './helpers.mjs';

let b;

// A sentence with markup in it: the page must show it as text.
const WAITING = 'waiting: 3 of 3 a100 held, 1 by pods in namespace <b>research</b> that bookings do not preempt';

describe('other workloads', () => {
  before(async () => {
    await waitReady();
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
  });

  it('shows the cards other workloads hold, the admins\' warning and why a booking waits', async () => {
    const page = await newPage(b.browser);
    let declared = null;
    await page.route((url) => url.pathname === '/api/v1/models', async (route) => {
      if (route.request().method() !== 'GET') return route.continue();
      const res = await route.fetch();
      if (!res.ok()) return route.fulfill({ response: res });
      const models = await res.json();
      for (const m of models) {
        if (m.name !== 'a100') continue;
        declared = m.units;
        Object.assign(m, {
          cards: m.units, others_in_use: 1, other_namespaces: ['research'],
          bookable: m.units - 1, over_declared: true,
        });
      }
      return route.fulfill({ response: res, json: models });
    });
    const now = Date.now();
    const running = {
      id: 990001, user: ADMIN, model: 'a100', slot: 0, units: 1, slots: [0],
      start: new Date(now - 3600000).toISOString(), end: new Date(now + DAY_MS).toISOString(),
      booked_end: new Date(now + DAY_MS).toISOString(), status: 'active',
      created_at: new Date(now - 7200000).toISOString(), cancelled_at: null, ended_early_at: null,
      override: false, waiting: WAITING,
    };
    await page.route((url) => url.pathname === '/api/v1/bookings' && !url.search, async (route) => {
      if (route.request().method() !== 'GET') return route.continue();
      const res = await route.fetch();
      if (!res.ok()) return route.fulfill({ response: res });
      return route.fulfill({ response: res, json: [running, ...(await res.json())] });
    });
    await signInWithToken(page, ADMIN_TOKEN);

    // Everyone's calendar: beside the units in use, who else holds cards.
    await page.goto(`${BASE}/#book`);
    const heading = page.locator('#cal-a100');
    await heading.waitFor({ state: 'attached' });
    assert.match(await heading.innerText(), /1 held by other workloads \(namespaces: research\)/);
    assert.ok(declared !== null, 'a100 was listed');

    // The admins' models: the same, and the warning.
    await page.goto(`${BASE}/#admin`);
    const form = page.locator('form.model-form[data-model="a100"]');
    await form.waitFor();
    assert.equal(await form.locator('.others-note').innerText(), '1 held by other workloads (namespaces: research).');
    assert.equal(await form.locator('.over-declared').innerText(),
      `Declared ${declared} ${declared === 1 ? 'unit' : 'units'}; bookings can get ${declared - 1}: other workloads hold 1.`);
    assert.deepEqual(await contrastFailures(page), []);
    await form.scrollIntoViewIfNeeded();
    await shot(page, 'other-workloads-01-admin-models.png', false);

    // My bookings: the running booking says why it waits, as text.
    await page.goto(`${BASE}/#mine`);
    const note = page.locator(`#mine-list tr[data-id="${running.id}"] .waiting-note`);
    await note.waitFor();
    assert.equal(await note.innerText(), WAITING);
    assert.equal(await note.locator('b').count(), 0, 'the sentence is text, not markup');
    assert.equal(await page.locator('#mine-list .waiting-note').count(), 1, 'only the running booking waits');
    assert.deepEqual(await contrastFailures(page), []);
    await shot(page, 'other-workloads-02-waiting.png', false);
    page.assertClean();
    await page.context().close();
  });
});
