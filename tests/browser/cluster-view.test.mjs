// The demo's cluster view in Debian's Chromium (run.sh starts `gpu-booking demo`, whose
// simulated lab has the webhook and the controller on it): spawn a notebook through
// the page as a user with a booking and see it bound to a card of the booked model,
// then as an unbooked user and see a lent card; stop one. Leaves the screenshot that
// docs/cluster-view.png is copied from.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BASE, ADMIN_TOKEN, launch, newPage, shot, api, waitReady, signInWithToken, contrastFailures, unlabelled,
} from './helpers.mjs';

const BOOKED = 'yann@uni.example';
const LENT = 'bob@example.com';

let b;

describe('cluster view (demo)', () => {
  before(async () => {
    await waitReady();
    b = await launch();
    // yann books an A6000 from now (an admin's booking, overriding the shortest-booking rule).
    const start = new Date(Date.now() - 1000);
    await api('POST', '/bookings', ADMIN_TOKEN, {
      model: 'a6000', user: BOOKED, start: start.toISOString(),
      end: new Date(start.getTime() + 3600000).toISOString(), override: true,
    });
  });

  after(async () => {
    if (b) await b.close();
  });

  it('spawns through the page and sees the pods bound', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.locator('#tab-cluster').waitFor();
    await page.locator('#tab-cluster').click();
    await page.locator('#view-cluster').waitFor();
    await page.locator('.cl-node').first().waitFor();
    assert.equal(await page.locator('.cl-node').count(), 3, 'three GPU nodes: one A100 node, two A6000 nodes');

    // The booked user: a card on an A6000 node, booked, with its end.
    await page.getByLabel('Notebook user', { exact: true }).fill(BOOKED);
    await page.getByLabel('GPUs to ask for', { exact: true }).selectOption('1');
    await page.getByRole('button', { name: 'Spawn a notebook as this user' }).click();
    await page.locator('#cl-result', { hasText: 'Spawned jupyter-' }).waitFor();
    const booked = page.locator('.cl-node[data-node^="gpu-a6000"] .cl-unit.cl-booked', { hasText: BOOKED });
    await booked.waitFor({ timeout: 20000 });
    assert.match(await booked.innerText(), /booked by yann@uni\.example until/);

    // An unbooked user: lent a free card.
    await page.getByLabel('Notebook user', { exact: true }).fill(LENT);
    await page.getByRole('button', { name: 'Spawn a notebook as this user' }).click();
    const lent = page.locator('.cl-unit.cl-lent', { hasText: LENT });
    await lent.waitFor({ timeout: 20000 });
    assert.match(await lent.innerText(), /lent to bob@example\.com/);
    await page.locator('.cl-pod', { hasText: `lent to ${LENT}` }).locator('button').waitFor();
    await shot(page, 'cluster-view.png');

    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    assert.deepEqual(await contrastFailures(page), [], 'text contrast is at least 4.5:1');

    // Stopping frees the card.
    await page.getByRole('button', { name: `Stop the notebook of ${LENT}` }).click();
    await page.locator('.cl-unit.cl-lent', { hasText: LENT }).waitFor({ state: 'detached', timeout: 20000 });
    page.assertClean();
    await page.context().close();
  });

  it('refuses a bad user name with a message, and changes nothing', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.goto(`${BASE}/#cluster`);
    await page.locator('.cl-node').first().waitFor();
    const before = await page.locator('.cl-pod').count();
    await page.getByLabel('Notebook user', { exact: true }).fill(' padded ');
    await page.evaluate(() => { document.getElementById('cl-user').value = 'bad\u0007name'; });
    await page.getByRole('button', { name: 'Spawn a notebook as this user' }).click();
    await page.locator('#cl-result', { hasText: 'The cluster refused the notebook' }).waitFor();
    assert.equal(await page.locator('.cl-pod').count(), before);
    page.assertClean();
    await page.context().close();
  });
});
