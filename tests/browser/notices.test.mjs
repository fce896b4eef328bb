// Notice settings on the page (notices.js in the "My bookings" view): a notice the
// demo derived from an audit row is listed; bad input is refused with its message and
// changes nothing; the settings are saved and read back. Leaves the screenshot that
// docs/notices.png is copied from.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  USER, USER_TOKEN, ADMIN_TOKEN, launch, newPage, shot, api, waitReady, signInWithToken, unlabelled,
} from './helpers.mjs';

let b;

describe('notice settings', () => {
  before(async () => {
    await waitReady();
    b = await launch();
    // What the webhook reports when it strips a spawn (the admin role may report too);
    // the demo's notice worker turns it into a notice within seconds.
    await api('POST', '/audit', ADMIN_TOKEN, {
      action: 'webhook.strip', subject: 'jhub/jupyter-alice', user: USER,
      details: { warning: 'gpu-booking: no GPU is free; book one to get a100' },
    });
  });

  after(async () => {
    if (b) await b.close();
  });

  it('lists notices and saves preferences', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    await page.goto(page.url().replace(/#.*$/, '') + '#mine');
    await page.locator('#notice-prefs h3', { hasText: 'Notices' }).waitFor();
    // The derived notice appears (the worker runs every 2 s in the demo).
    let listed = false;
    for (let i = 0; i < 30 && !listed; i++) {
      await page.evaluate(() => { location.hash = '#book'; });
      await page.evaluate(() => { location.hash = '#mine'; });
      listed = await page.locator('#np-recent li[data-notice="spawn_stripped"]').count() > 0;
      if (!listed) await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(listed, 'the stripped spawn is listed');
    assert.match(await page.locator('#np-recent').innerText(), /Your notebook started without a GPU/);

    // A bad address: the API's message, nothing saved.
    // The last hash change above reloads the card; a message shown before that reload
    // ends is cleared by it (seen when the notice took long to appear): try again.
    let refused = false;
    for (let i = 0; i < 5 && !refused; i++) {
      await page.getByLabel('Address').fill('not an address');
      await page.getByRole('button', { name: 'Save notice settings' }).click();
      refused = await page.locator('#np-status.error', { hasText: 'email must be an address' })
        .waitFor({ timeout: 3000 }).then(() => true, () => false);
    }
    assert.ok(refused, 'the bad address is refused with its message');
    assert.equal((await api('GET', '/me/notices', USER_TOKEN)).prefs.email, null);

    await page.getByLabel('Address').fill('alice.work@example.com');
    await page.getByLabel('when a notebook starts without a GPU').uncheck();
    await page.getByRole('button', { name: 'Save notice settings' }).click();
    await page.locator('#np-status', { hasText: 'Saved.' }).waitFor();
    const saved = await api('GET', '/me/notices', USER_TOKEN);
    assert.equal(saved.prefs.email, 'alice.work@example.com');
    assert.deepEqual(saved.prefs.muted, ['spawn_stripped']);
    assert.equal(await page.getByLabel('Address').inputValue(), 'alice.work@example.com');
    assert.equal(await page.getByLabel('when a notebook starts without a GPU').isChecked(), false);

    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    await page.locator('#notice-prefs').scrollIntoViewIfNeeded();
    await shot(page, 'notices.png');
    page.assertClean();
  });
});
