// The demo's user picker in Debian's Chromium (run.sh starts `gpu-booking demo`): sign
// in as any user from the sign-in view, as an admin when asked; a name the API would
// refuse gets a message and no sign-in. Then the booked sample user, zoë, spawns her
// notebook in the seeded lab (both a100s lent to dave and erin) and takes one of
// them back. Leaves the
// screenshot that docs/demo-signin.png is copied from.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { BASE, launch, newPage, shot, waitReady, contrastFailures, unlabelled } from './helpers.mjs';

let b;

async function pick(page, user, admin = false) {
  await page.getByLabel('User name', { exact: true }).fill(user);
  if (admin) await page.getByLabel('as an admin', { exact: true }).check();
  await page.getByRole('button', { name: 'Sign in as this user' }).click();
}

describe('demo user picker', () => {
  before(async () => {
    await waitReady();
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
  });

  it('signs in as any user, and as an admin when asked', async () => {
    const page = await newPage(b.browser);
    await page.goto(`${BASE}/`);
    const picker = page.locator('#demo-signin');
    await picker.locator('#demo-user').waitFor();
    assert.match(await picker.innerText(), /Demo: sign in as any user/);
    // The sample users are offered.
    const offered = await page.locator('#demo-users option').evaluateAll((os) => os.map((o) => o.value));
    assert.ok(offered.includes('zoë@uni.example'), `offered: ${offered}`);
    await page.getByLabel('User name', { exact: true }).fill('dana@example.com');
    await shot(page, 'demo-signin.png');
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    assert.deepEqual(await contrastFailures(page), [], 'text contrast is at least 4.5:1');

    await page.getByRole('button', { name: 'Sign in as this user' }).click();
    await page.locator('#who-text', { hasText: 'Signed in as dana@example.com' }).waitFor();
    assert.equal(await page.locator('#tab-admin').isVisible(), false, 'a user is no admin');

    await page.getByRole('button', { name: 'Sign out' }).click();
    await picker.locator('#demo-user').waitFor();
    await pick(page, 'root@example.com', true);
    await page.locator('#who-text', { hasText: 'Signed in as root@example.com (admin)' }).waitFor();
    await page.locator('#tab-admin').waitFor();
    page.assertClean();
    await page.context().close();
  });

  it('refuses a name the API would refuse, and signs nobody in', async () => {
    const page = await newPage(b.browser);
    await page.goto(`${BASE}/`);
    await page.locator('#demo-user').waitFor();
    await page.evaluate(() => { document.getElementById('demo-user').value = 'bad\u0007name'; });
    await page.getByRole('button', { name: 'Sign in as this user' }).click();
    await page.locator('#demo-signin-problem', { hasText: 'The demo did not sign you in' }).waitFor();
    assert.equal(await page.locator('#who').isVisible(), false);
    assert.equal(await page.evaluate(() => sessionStorage.length), 0, 'no token kept');
    page.assertClean();
    await page.context().close();
  });

  it('the booked sample user takes a lent a100 back in the seeded lab', async () => {
    const page = await newPage(b.browser);
    await page.goto(`${BASE}/`);
    await page.locator('#demo-user').waitFor();
    await pick(page, 'zoë@uni.example');
    await page.locator('#who-text', { hasText: 'Signed in as zoë@uni.example' }).waitFor();
    await page.locator('#tab-cluster').click();
    const a100 = page.locator('.cl-node[data-node="gpu-a100-0"]');
    await a100.locator('.cl-unit.cl-lent').nth(1).waitFor({ timeout: 20000 });
    assert.match(await a100.innerText(), /0 of 2 GPUs free/);
    // The spawn form is filled with the signed-in user.
    assert.equal(await page.getByLabel('Notebook user', { exact: true }).inputValue(), 'zoë@uni.example');
    await page.getByRole('button', { name: 'Spawn a notebook as this user' }).click();
    // The lent notebook that gives way is warned first (the demo's 10 s grace).
    await a100.locator('.cl-unit.cl-booked', { hasText: 'zoë@uni.example' }).waitFor({ timeout: 60000 });
    await a100.locator('.cl-unit.cl-lent').waitFor({ timeout: 20000 });
    assert.equal(await a100.locator('.cl-unit.cl-lent').count(), 1, 'exactly one lent a100 gave way');
    page.assertClean();
    await page.context().close();
  });
});
