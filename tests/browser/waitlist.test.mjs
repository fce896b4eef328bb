// The waitlist and the calendar links on "My bookings" in Debian's Chromium, against
// `gpu-booking demo` (run.sh): join a full model's waitlist through the page and see
// the place in line, leave it, see the next user in line booked when a unit frees up;
// make calendar links, fetch a feed, replace and revoke them. Leaves the screenshot
// that docs/waitlist.png is copied from.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BASE, USER_TOKEN, ADMIN_TOKEN, USER, launch, newPage, shot, api, waitReady, signInWithToken, unlabelled,
} from './helpers.mjs';

const NEXT = 'dora@uni.example';
const HOUR = 3600000;

let b;
const holders = [];

describe('waitlist and calendar links', () => {
  before(async () => {
    await waitReady();
    b = await launch();
    // Every a100 unit booked for two weeks from the first moment it is free (admins'
    // exceptions), until no day is free within the next eight days, whatever the seed
    // and the other test files booked: the waitlist has to wait.
    const horizon = Date.now() + 8 * 24 * HOUR;
    let start = new Date(Date.now() + 1000);
    for (let i = 0; i < 16 && start.getTime() < horizon; i++) {
      const res = await fetch(`${BASE}/api/v1/bookings`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({
          model: 'a100', user: `wl-holder-${i}@uni.example`, override: true,
          start: start.toISOString(), end: new Date(start.getTime() + 14 * 24 * HOUR).toISOString(),
        }),
      });
      const body = await res.json();
      if (res.status === 201) { holders.push(body); continue; }
      assert.equal(body.error, 'capacity', JSON.stringify(body));
      // The earliest start with a free unit for two weeks (a second later: the API
      // has microseconds, a JavaScript Date milliseconds).
      start = new Date(Math.max(new Date(body.earliest_start).getTime() + 1000, Date.now() + 1000));
    }
    assert.ok(start.getTime() >= horizon, 'a100 is full for the next eight days: ' + JSON.stringify({ start, holders: holders.map((h) => [h.start, h.end, h.slot]) }));
    assert.ok(holders.length >= 1);
  });

  after(async () => {
    if (b) await b.close();
  });

  it('joins a full model\'s waitlist, sees its place in line, and leaves it', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    await page.goto(`${BASE}/#mine`);
    await page.locator('#wl-title').waitFor();
    await page.locator('#wl-model option[value="a100"]').waitFor({ state: 'attached' });
    const form = page.locator('#waitlist');
    await form.getByLabel('GPU model', { exact: true }).selectOption('a100');
    await form.getByLabel('Number of days', { exact: true }).fill('1');
    await page.getByRole('button', { name: 'Join the waitlist' }).click();
    await page.locator('#wl-result', { hasText: /./ }).waitFor();
    assert.match(await page.locator('#wl-result').innerText(), /#1 in line/);
    const row = page.locator('#wl-list tr[data-state="waiting"]', { hasText: 'a100' });
    await row.waitFor();
    assert.match(await row.innerText(), /#1 in line/);

    // dora joins after alice: second in line.
    const dora = await api('POST', '/waitlist', ADMIN_TOKEN, { model: 'a100', user: NEXT, days: 1 });
    assert.equal(dora.state, 'waiting');
    assert.equal(dora.position, 2);
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    await shot(page, 'waitlist.png');

    await row.getByRole('button', { name: 'Leave the waitlist of a100' }).click();
    await page.locator('#wl-list tr[data-state="cancelled"]', { hasText: 'a100' }).waitFor();
    const mine = await api('GET', '/waitlist', USER_TOKEN);
    assert.equal(mine.filter((e) => e.state === 'waiting').length, 0);
    page.assertClean();
    await page.context().close();
  });

  it('books the next in line the moment a unit frees up', async () => {
    const [doraEntry] = (await api('GET', '/waitlist?all=true&model=a100', ADMIN_TOKEN))
      .filter((e) => e.user === NEXT && e.state === 'waiting');
    assert.equal(doraEntry.position, 1, 'dora moved up when alice left');
    // The first holder's booking started first (now): ending it frees a unit from now.
    await api('DELETE', `/bookings/${holders[0].id}`, ADMIN_TOKEN);
    const after = (await api('GET', '/waitlist?all=true&model=a100', ADMIN_TOKEN)).find((e) => e.id === doraEntry.id);
    assert.equal(after.state, 'booked');
    const booking = await api('GET', `/bookings/${after.booking_id}`, ADMIN_TOKEN);
    assert.equal(booking.user, NEXT);
    assert.equal(booking.model, 'a100');
  });

  it('makes calendar links that a calendar app can fetch, and revokes them', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    await page.goto(`${BASE}/#mine`);
    await page.locator('#feed-title').waitFor();
    await page.locator('#wl-model option[value="a100"]').waitFor({ state: 'attached' });
    await page.getByRole('button', { name: /Make (calendar|new) links/ }).click();
    const mineLink = page.getByLabel('Calendar link: My bookings', { exact: true });
    await mineLink.waitFor();
    const first = await mineLink.inputValue();
    assert.match(first, /\/api\/v1\/feeds\/[0-9a-f]{64}\/bookings\.ics$/);
    const modelLink = await page.getByLabel('Calendar link: When a100 is booked', { exact: true }).inputValue();
    for (const url of [first, modelLink]) {
      const res = await fetch(url);
      assert.equal(res.status, 200, url);
      assert.match(res.headers.get('content-type'), /^text\/calendar/);
      const text = await res.text();
      assert.match(text, /^BEGIN:VCALENDAR\r\n/);
      assert.ok(!text.includes(NEXT), 'no other user is named');
    }
    await page.locator('#feed-state', { hasText: 'You have calendar links' }).waitFor();

    // New links: the old one stops working.
    await page.getByRole('button', { name: 'Make new links' }).click();
    await page.waitForFunction((old) => document.querySelector('.feed-url') && document.querySelector('.feed-url').value !== old, first);
    const second = await page.getByLabel('Calendar link: My bookings', { exact: true }).inputValue();
    assert.equal((await fetch(first)).status, 404);
    assert.equal((await fetch(second)).status, 200);

    await page.getByRole('button', { name: 'Revoke my calendar links' }).click();
    await page.locator('#feed-state', { hasText: 'You have no calendar links' }).waitFor();
    assert.equal((await fetch(second)).status, 404);
    page.assertClean();
    await page.context().close();
  });
});
