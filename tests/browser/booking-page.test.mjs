// The booking page in Debian's Chromium against the real API on the real
// Postgres (run.sh starts `gpu-booking demo` on a fresh database). The steps
// build on each other and run in order.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import {
  BASE, USER_TOKEN, ADMIN_TOKEN, USER, ADMIN, DAY_MS,
  launch, newPage, shot, api, waitReady, localInput, localClock, ceilMinute, utcDate,
  signInWithToken, calendarFree, contrastFailures, unlabelled,
} from './helpers.mjs';

let b; // the browser
let alice; // alice's page (pasted user token), open throughout
let admin; // the admin's page (pasted admin token), open throughout
const s = {}; // what one step leaves for the next

describe('booking page', () => {
  before(async () => {
    await waitReady();
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
  });

  it('signed out: says how to sign in, refuses a bad token', async () => {
    const page = await newPage(b.browser);
    await page.goto(`${BASE}/`);
    const signin = page.locator('#view-signin');
    await signin.waitFor();
    const text = await signin.innerText();
    assert.match(text, /sign-in proxy \(such as oauth2-proxy\)/);
    assert.match(text, /No sign-in proxy passed an identity on/);
    // Only the ways this server has: no single sign-on or JupyterHub button here,
    // and the token box open, as nothing else is set up.
    assert.doesNotMatch(text, /Single sign-on|Sign in with JupyterHub/);
    assert.match(text, /Paste a token/);
    assert.equal(await page.locator('#token-signin').getAttribute('open'), '', 'the token box is open');
    assert.equal(await page.locator('#tabs').isVisible(), false, 'no views while signed out');
    await shot(page, '01-signed-out.png');

    await page.getByLabel('Bearer token').fill('not-a-token');
    await page.getByRole('button', { name: 'Sign in with this token' }).click();
    await assert.doesNotReject(page.locator('#signin-problem', { hasText: 'This token was not accepted' }).waitFor());
    assert.equal(await page.locator('#who').isVisible(), false);
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    assert.deepEqual(await contrastFailures(page), [], 'text contrast is at least 4.5:1');
    page.assertClean();
    await page.context().close();
  });

  it('keyboard only: tab to the token field, sign in, focus is visible', async () => {
    const page = await newPage(b.browser);
    await page.goto(`${BASE}/`);
    await page.locator('#view-signin').waitFor();
    let reached = false;
    for (let i = 0; i < 12 && !reached; i++) {
      await page.keyboard.press('Tab');
      reached = await page.evaluate(() => document.activeElement && document.activeElement.id === 'token-input');
    }
    assert.ok(reached, 'the token field is reachable with Tab');
    await page.keyboard.insertText(USER_TOKEN);
    await page.keyboard.press('Tab');
    const outline = await page.evaluate(() => {
      const cs = getComputedStyle(document.activeElement);
      return { tag: document.activeElement.textContent, style: cs.outlineStyle, width: parseFloat(cs.outlineWidth) };
    });
    assert.equal(outline.tag, 'Sign in with this token');
    assert.notEqual(outline.style, 'none', 'focused button shows an outline');
    assert.ok(outline.width >= 2, 'the outline is at least 2px');
    await page.keyboard.press('Enter');
    await page.locator('#who-text', { hasText: `Signed in as ${USER}` }).waitFor();
    // Focus moves to the new view's heading.
    await page.waitForFunction(() => document.activeElement && document.activeElement.id === 'book-title');
    // Sign out clears the token kept in the tab.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.locator('#view-signin').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
    await page.reload();
    await page.locator('#view-signin').waitFor();
    page.assertClean();
    await page.context().close();
  });

  it('auth proxy: a bearer token added in front signs the page in', async () => {
    // What oauth2-proxy does: every request to the service carries the header.
    const page = await newPage(b.browser, { extraHTTPHeaders: { Authorization: `Bearer ${USER_TOKEN}` } });
    await page.goto(`${BASE}/`);
    await page.locator('#who-text', { hasText: 'Signed in through the sign-in proxy' }).waitFor();
    await page.locator('table.calendar').first().waitFor();
    assert.equal(await page.locator('#tab-admin').isVisible(), false, 'a user token shows no admin view');
    assert.equal(await page.locator('#sign-out').isVisible(), false, 'the proxy signs out, not the page');
    page.assertClean();
    await page.context().close();
  });

  it('OIDC: authorization code with PKCE against the configured issuer', async () => {
    const issuer = 'https://idp.example.test/realms/lab';
    const page = await newPage(b.browser, { allowOrigins: ['https://idp.example.test'] });
    const seen = {};
    // The server's injection of the issuer and client id into the page.
    await page.route((url) => url.origin === new URL(BASE).origin && url.pathname === '/', async (route) => {
      const res = await route.fetch();
      const html = (await res.text())
        .replace('name="gpu-booking-oidc-issuer" content=""', `name="gpu-booking-oidc-issuer" content="${issuer}"`)
        .replace('name="gpu-booking-oidc-client-id" content=""', 'name="gpu-booking-oidc-client-id" content="gpu-booking-page"');
      await route.fulfill({ response: res, body: html });
    });
    // A fake issuer: discovery, an authorization endpoint that consents at
    // once, and a token endpoint that checks the PKCE verifier.
    const cors = { 'access-control-allow-origin': '*', 'content-type': 'application/json' };
    await page.route('https://idp.example.test/**', async (route) => {
      const req = route.request();
      const url = new URL(req.url());
      if (url.pathname.endsWith('/.well-known/openid-configuration')) {
        seen.discovery = true;
        return route.fulfill({
          headers: cors,
          body: JSON.stringify({
            issuer,
            authorization_endpoint: `${issuer}/protocol/openid-connect/auth`,
            token_endpoint: `${issuer}/protocol/openid-connect/token`,
          }),
        });
      }
      if (url.pathname.endsWith('/auth')) {
        seen.auth = Object.fromEntries(url.searchParams);
        const back = new URL(seen.auth.redirect_uri);
        back.searchParams.set('code', 'code-123');
        back.searchParams.set('state', seen.auth.state);
        // A page that sends the browser back (a fulfilled 302's target would
        // bypass the route that injects the configuration).
        return route.fulfill({
          headers: { 'content-type': 'text/html' },
          body: `<!doctype html><meta http-equiv="refresh" content="0;url=${back.toString().replace(/&/g, '&amp;')}">`,
        });
      }
      if (url.pathname.endsWith('/token')) {
        const form = Object.fromEntries(new URLSearchParams(req.postData()));
        seen.token = form;
        const challenge = createHash('sha256').update(form.code_verifier || '').digest('base64url');
        if (form.code !== 'code-123' || challenge !== seen.auth.code_challenge || form.grant_type !== 'authorization_code') {
          return route.fulfill({ status: 400, headers: cors, body: JSON.stringify({ error: 'invalid_grant' }) });
        }
        const enc = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
        const idToken = `${enc({ alg: 'none' })}.${enc({ sub: USER, nonce: seen.auth.nonce })}.`;
        // The access token is one the API accepts: the demo's user token.
        return route.fulfill({ headers: cors, body: JSON.stringify({ access_token: USER_TOKEN, id_token: idToken, token_type: 'Bearer' }) });
      }
      return route.fulfill({ status: 404, body: '' });
    });

    // A forged answer (a state this tab never sent) is refused.
    await page.goto(`${BASE}/?code=code-123&state=forged`);
    await page.locator('#signin-problem', { hasText: 'does not match the request (state)' }).waitFor();

    await page.goto(`${BASE}/`);
    await page.getByRole('button', { name: 'Sign in with single sign-on' }).click();
    await page.locator('#who-text', { hasText: `Signed in as ${USER}` }).waitFor();
    assert.ok(seen.discovery, 'discovery document fetched');
    assert.equal(seen.auth.response_type, 'code');
    assert.equal(seen.auth.client_id, 'gpu-booking-page');
    assert.equal(seen.auth.code_challenge_method, 'S256');
    assert.equal(seen.auth.redirect_uri, `${BASE}/`);
    assert.match(seen.auth.scope, /openid/);
    assert.equal(seen.token.client_id, 'gpu-booking-page');
    assert.equal(new URL(page.url()).search, '', 'code and state are removed from the address');
    await page.locator('table.calendar').first().waitFor();
    page.assertClean();
    await page.context().close();
  });

  it('user: signs in by pasting a token and sees free units per model', async () => {
    alice = await newPage(b.browser);
    await signInWithToken(alice, USER_TOKEN);
    assert.equal(await alice.locator('#who-text').innerText(), `Signed in as ${USER}`);
    assert.equal(await alice.locator('#tab-admin').isVisible(), false);
    const models = await api('GET', '/models', USER_TOKEN);
    assert.ok(models.length >= 2, 'the demo seeds models');
    for (const m of models) {
      const av = await api('GET', `/models/${m.name}/availability`, USER_TOKEN);
      const table = alice.locator(`table.calendar[data-model="${m.name}"]`);
      await table.waitFor();
      const cells = table.locator('td[data-date]');
      assert.equal(await cells.count(), av.days.length, `${m.name}: one cell a day`);
      for (const d of [av.days[0], av.days[13], av.days[av.days.length - 1]]) {
        assert.equal(await calendarFree(alice, m.name, d.date), d.free, `${m.name} ${d.date}`);
        const cls = await table.locator(`td[data-date="${d.date}"]`).getAttribute('class');
        assert.match(cls, d.free === av.units ? /day-full/ : d.free === 0 ? /day-none/ : /day-some/);
      }
      assert.match(await alice.locator(`#cal-${m.name}`).innerText(), new RegExp(`${m.units} units`));
    }
    assert.match(await alice.locator('.legend').innerText(), /every unit free[\s\S]*some units free[\s\S]*no unit free/);
    assert.deepEqual(await unlabelled(alice), []);
    assert.deepEqual(await contrastFailures(alice), []);
  });

  it('user: the earliest start is shown and pre-filled (now, when nothing stands in the way)', async () => {
    await alice.locator('#book-form').getByLabel('GPU model').selectOption('a6000');
    // Outside the policy: the API's refusal, in words.
    await alice.locator('#book-form').getByLabel('Number of days').fill('30');
    const tooLong = alice.locator('#book-earliest [data-code="duration_too_long"]');
    await tooLong.waitFor();
    assert.match(await tooLong.innerText(), /longer than the longest booking allowed[\s\S]*at most 14 days/);
    await alice.locator('#book-form').getByLabel('Number of days').fill('2');
    await alice.locator('#book-earliest', { hasText: 'you can start right away' }).waitFor();
    const ns = await api('GET', '/me/next-start?model=a6000&days=2', USER_TOKEN);
    assert.deepEqual(ns.reasons, []);
    const value = await alice.locator('#book-form').getByLabel(/^Start/).inputValue();
    // The input holds local time (the browser's zone), rounded up to the minute.
    const shown = await alice.evaluate((v) => new Date(v).getTime(), value);
    const now = new Date(ns.earliest_start).getTime();
    assert.ok(shown >= now - 60000 && shown <= now + 60000 && shown % 60000 === 0, `pre-filled start ${value} is now`);
    assert.match(await alice.locator('#book-end').innerText(), /^Ends /);
  });

  it('admin: books for a user as a clearly marked exception, after a readable refusal', async () => {
    admin = await newPage(b.browser);
    await signInWithToken(admin, ADMIN_TOKEN);
    assert.equal(await admin.locator('#who-text').innerText(), `Signed in as ${ADMIN} (admin)`);
    await admin.locator('#tabs').getByRole('link', { name: 'Admin' }).click();
    await admin.locator('#view-admin').waitFor();
    // A booking for alice that ended two days ago: her cooldown runs on.
    const start = new Date(Date.now() - 3 * DAY_MS);
    await admin.getByLabel('User (e-mail or user name)').fill(USER);
    await admin.locator('#ac-model').selectOption('a6000');
    await admin.locator('#ac-start').fill(localInput(start));
    await admin.locator('#ac-days').fill('1');
    await admin.getByRole('button', { name: 'Book for this user', exact: true }).click();
    const refusal = admin.locator('#ac-result .refusal[data-code="start_in_past"]');
    await refusal.waitFor();
    assert.match(await refusal.innerText(), /A booking cannot start in the past\.[\s\S]*The booking service says: .*cannot start in the past/);
    assert.ok(await refusal.getByRole('button', { name: 'Use this time' }).isVisible());

    await admin.getByLabel(/Override the booking rules/).check();
    assert.match(await admin.locator('#admin-create').getAttribute('class'), /override-on/);
    await admin.getByRole('button', { name: 'Book for this user as an exception' }).click();
    const ok = admin.locator('#ac-result .notice.ok');
    await ok.waitFor();
    assert.match(await ok.innerText(), /Booked as an exception: a6000 for alice@example\.com .*ended/);
    const [past] = await api('GET', `/bookings?user=${encodeURIComponent(USER)}`, ADMIN_TOKEN);
    assert.equal(past.override, true);
    s.pastEnd = past.end;
    // The admin's own running booking, for "time left" and "end early" later.
    await admin.getByLabel('User (e-mail or user name)').fill(ADMIN);
    await admin.locator('#ac-model').selectOption('a100');
    await admin.locator('#ac-start').fill(localInput(new Date(Date.now() - 3600000)));
    await admin.locator('#ac-days').fill('2');
    await admin.getByRole('button', { name: 'Book for this user as an exception' }).click();
    await admin.locator('#ac-result .notice.ok', { hasText: 'active' }).waitFor();
    const rows = admin.locator('#ab-list tr[data-id]');
    await admin.locator('#ab-list td', { hasText: ADMIN }).first().waitFor();
    // Both, and the running booking the demo seeds for its "booked" sample review.
    assert.equal(await rows.count(), 3, 'all bookings lists both and the seeded one');
    assert.equal(await admin.locator('#ab-list .badge-exception').count(), 2, 'overrides are marked');
    admin.assertClean();
  });

  it('user: the earliest start moves to the end of the cooldown, with the reason in words', async () => {
    await alice.locator('#book-form').getByLabel('Number of days').fill('1');
    const reason = alice.locator('#book-earliest li[data-code="cooldown"]');
    await reason.waitFor();
    const ns = await api('GET', '/me/next-start?model=a6000&days=1', USER_TOKEN);
    const cooldownEnd = new Date(ns.reasons.find((r) => r.code === 'cooldown').until);
    assert.equal(cooldownEnd.getTime(), new Date(s.pastEnd).getTime() + 14 * DAY_MS, 'the API counts the cooldown');
    const text = await reason.innerText();
    assert.match(text, /^cooldown until /);
    assert.ok(text.includes(localClock(ceilMinute(cooldownEnd))) || text.includes(localClock(cooldownEnd)), `${text} names the time`);
    assert.equal(await alice.locator('#book-form').getByLabel(/^Start/).inputValue(), localInput(ceilMinute(ns.earliest_start)));
    s.earliest = ns.earliest_start;
    s.day = utcDate(ns.earliest_start);
    s.freeBefore = await calendarFree(alice, 'a6000', s.day);
    assert.equal(s.freeBefore, 4);
  });

  it('user: books; the booking is listed and the calendar shows one fewer free unit', async () => {
    await alice.getByRole('button', { name: 'Book', exact: true }).click();
    const ok = alice.locator('#book-ok');
    await ok.waitFor();
    assert.match(await ok.innerText(), /^Booked: a6000 from /);
    const [mine] = await api('GET', '/bookings', USER_TOKEN);
    assert.equal(mine.status, 'planned');
    assert.equal(new Date(mine.start).getTime(), new Date(s.earliest).getTime(), 'the exact earliest start was sent');
    assert.equal(new Date(mine.end).getTime() - new Date(mine.start).getTime(), DAY_MS);
    s.booking = mine;
    await alice.waitForFunction(([day, before]) => {
      const c = document.querySelector(`table.calendar[data-model="a6000"] td[data-date="${day}"]`);
      return c && Number(c.dataset.free) === before - 1;
    }, [s.day, s.freeBefore]);
    assert.equal(await calendarFree(alice, 'a6000', s.day), s.freeBefore - 1);
    await shot(alice, '02-calendar-and-booking-form.png');

    await alice.locator('#tabs').getByRole('link', { name: 'My bookings' }).click();
    const row = alice.locator(`#mine-list tr[data-id="${mine.id}"]`);
    await row.waitFor();
    assert.match(await row.innerText(), /a6000[\s\S]*planned[\s\S]*starts in 1[12] days/);
    assert.ok(await row.getByRole('button', { name: /^Cancel/ }).isVisible());
  });

  it('user: a second booking is refused in plain words, with the earliest time it would be accepted', async () => {
    await alice.locator('#tabs').getByRole('link', { name: 'Book a GPU' }).click();
    await alice.locator('#book-earliest li[data-code="future_booking_exists"]').waitFor();
    assert.match(await alice.locator('#book-earliest').innerText(), /you have a planned booking until /);
    await alice.getByRole('button', { name: 'Book', exact: true }).click();
    const refusal = alice.locator('#book-result .refusal');
    await refusal.waitFor();
    assert.equal(await refusal.getAttribute('data-code'), 'future_booking_exists');
    const text = await refusal.innerText();
    assert.match(text, /^Not booked\. You already have a planned booking/);
    assert.match(text, /The booking service says: .*already have a planned booking/);
    assert.match(text, /It would be accepted from /);
    const expected = new Date(new Date(s.booking.end).getTime() + 14 * DAY_MS);
    assert.ok(text.includes(localClock(expected)), `${text} names ${expected.toISOString()}`);
    assert.match(await alice.locator('#book-result').getAttribute('aria-live'), /polite/);
    await alice.locator('#book-form').getByLabel(/^Start/).fill(localInput(new Date(Date.now() + 20 * DAY_MS)));
    await shot(alice, '04-refusal.png');
    await refusal.getByRole('button', { name: 'Use this time' }).click();
    assert.equal(await alice.locator('#book-form').getByLabel(/^Start/).inputValue(), localInput(ceilMinute(expected)));
    assert.equal(await alice.evaluate(() => document.activeElement.id), 'book-start');
    assert.equal((await api('GET', '/bookings', USER_TOKEN)).filter((x) => x.status !== 'cancelled').length, 2, 'nothing new was booked');
  });

  it('user: cancels with a confirmation; the booking shows cancelled and the unit is free again', async () => {
    await alice.locator('#tabs').getByRole('link', { name: 'My bookings' }).click();
    const row = alice.locator(`#mine-list tr[data-id="${s.booking.id}"]`);
    await row.waitFor();
    // "Keep it" changes nothing.
    await row.getByRole('button', { name: /^Cancel/ }).click();
    const dialog = alice.locator('#confirm-dialog');
    await dialog.waitFor();
    assert.match(await dialog.innerText(), /Cancel this booking\?[\s\S]*will be cancelled/);
    await alice.keyboard.press('Escape');
    await dialog.waitFor({ state: 'hidden' });
    assert.equal((await api('GET', `/bookings/${s.booking.id}`, USER_TOKEN)).status, 'planned');

    await row.getByRole('button', { name: /^Cancel/ }).click();
    await dialog.getByRole('button', { name: 'Cancel booking' }).click();
    await alice.locator(`#mine-list tr[data-id="${s.booking.id}"][data-status="cancelled"]`).waitFor();
    assert.match(await alice.locator(`#mine-list tr[data-id="${s.booking.id}"]`).innerText(), /cancelled/);
    await alice.locator('#live', { hasText: `Booking ${s.booking.id} is now cancelled.` }).waitFor();
    assert.equal((await api('GET', `/bookings/${s.booking.id}`, USER_TOKEN)).status, 'cancelled');
    await shot(alice, '03-my-bookings.png');
    await alice.locator('#tabs').getByRole('link', { name: 'Book a GPU' }).click();
    await alice.waitForFunction(([day, before]) => {
      const c = document.querySelector(`table.calendar[data-model="a6000"] td[data-date="${day}"]`);
      return c && Number(c.dataset.free) === before;
    }, [s.day, s.freeBefore]);
    alice.assertClean();
  });

  it('phone width (375 px): nothing overflows sideways', async () => {
    await alice.setViewportSize({ width: 375, height: 812 });
    for (const view of ['book', 'mine']) {
      await alice.goto(`${BASE}/#${view}`);
      await alice.locator(view === 'book' ? 'table.calendar' : '#mine-list tr[data-id]').first().waitFor();
      const width = await alice.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(width <= 375, `#${view} is ${width}px wide`);
      await shot(alice, `06-phone-${view}.png`);
    }
    await alice.setViewportSize({ width: 1280, height: 900 });
    alice.assertClean();
  });

  it('user: an active booking shows the time left and ends early after a confirmation', async () => {
    await admin.locator('#tabs').getByRole('link', { name: 'My bookings' }).click();
    const row = admin.locator('#mine-list tr[data-status="active"]');
    await row.waitFor();
    assert.match(await row.locator('.time-left').innerText(), /^1 day 2[23] h left$/);
    await row.getByRole('button', { name: /^End early/ }).click();
    const dialog = admin.locator('#confirm-dialog');
    assert.match(await dialog.innerText(), /End this booking now\?/);
    await dialog.getByRole('button', { name: 'End it now' }).click();
    await admin.locator('#mine-list tr[data-status="ended"]').waitFor();
    assert.match(await admin.locator('#mine-list tr[data-status="ended"]').innerText(), /ended early/);
  });

  it('admin: all bookings with filters, the audit log of what happened, models and units', async () => {
    await admin.locator('#tabs').getByRole('link', { name: 'Admin' }).click();
    const list = admin.locator('#ab-list');
    await list.locator(`tr[data-id="${s.booking.id}"]`).waitFor();
    assert.match(await list.locator(`tr[data-id="${s.booking.id}"]`).innerText(), /alice@example\.com[\s\S]*a6000[\s\S]*cancelled/);
    assert.equal(await list.locator('tr[data-id]').count(), 4); // with the demo's seeded booking

    await admin.locator('#ab-user').fill(USER);
    await admin.locator('#ab-filter').getByRole('button', { name: 'Filter' }).click();
    await admin.waitForFunction(() => document.querySelectorAll('#ab-list tr[data-id]').length === 2);
    await admin.locator('#ab-user').fill('');
    await admin.locator('#ab-model').selectOption('a100');
    await admin.locator('#ab-filter').getByRole('button', { name: 'Filter' }).click();
    // The admin's a100 booking and the demo's seeded one (zoë's). The user filter's
    // answer had 2 rows too: wait for the model filter's own (a100 rows only).
    await admin.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#ab-list tr[data-id]')];
      return rows.length === 2 && rows.every((r) => /a100/.test(r.innerText) && !/a6000/.test(r.innerText));
    });
    assert.match(await list.innerText(), /admin@example\.com/);

    const audit = admin.locator('#aa-list');
    await admin.locator('#aa-filter').getByRole('button', { name: 'Filter' }).click();
    await audit.locator(`tr[data-action="booking.cancel"][data-booking="${s.booking.id}"]`).waitFor();
    for (const action of ['booking.create', 'booking.cancel']) {
      const r = audit.locator(`tr[data-action="${action}"][data-booking="${s.booking.id}"]`);
      assert.match(await r.innerText(), /alice@example\.com[\s\S]*a6000[\s\S]*alice@example\.com/, action);
    }
    assert.equal(await audit.locator('tr[data-action="booking.create_override"]').count(), 2);
    assert.equal(await audit.locator('tr[data-action="booking.end_early"]').count(), 1);
    await admin.locator('#aa-action').fill('booking.cancel');
    await admin.locator('#aa-filter').getByRole('button', { name: 'Filter' }).click();
    await admin.waitForFunction(() => [...document.querySelectorAll('#aa-list tr[data-action]')].every((r) => r.dataset.action === 'booking.cancel'));

    // Models and units: a100 gets a third unit and a second pattern.
    const form = admin.locator('form.model-form[data-model="a100"]');
    await form.getByLabel('Units').fill('3');
    await form.getByLabel('Product name patterns, one per line').fill('*A100*\n*H100*');
    await form.getByRole('button', { name: 'Save a100' }).click();
    await admin.locator('form.model-form[data-model="a100"] .notice.ok', { hasText: 'Saved: 3 units.' }).waitFor();
    const a100 = (await api('GET', '/models', ADMIN_TOKEN)).find((m) => m.name === 'a100');
    assert.equal(a100.units, 3);
    assert.deepEqual(a100.patterns, ['*A100*', '*H100*']);
    await admin.locator('#cal-a100', { hasText: '3 units' }).waitFor({ state: 'attached' });
    assert.match(await admin.locator('table.calendar[data-model="a100"] td[data-date] .free').last().textContent(), /^3\/3$/);
    // A new model: it is listed, bookable and in the calendar.
    const add = admin.locator('form.model-new');
    await add.getByLabel('Name', { exact: true }).fill('l40s');
    await add.getByLabel('Units').fill('2');
    await add.getByLabel('Extended resource').fill('nvidia.com/l40s');
    await add.getByLabel('Product name patterns, one per line').fill('*L40S*');
    await add.getByRole('button', { name: 'Add model' }).click();
    await admin.locator('form.model-form[data-model="l40s"] .notice.ok').waitFor();
    await admin.locator('table.calendar[data-model="l40s"]').waitFor({ state: 'attached' });
    assert.ok(await admin.locator('#book-model option[value="l40s"]').count());
    const l40s = (await api('GET', '/models', ADMIN_TOKEN)).find((m) => m.name === 'l40s');
    assert.equal(l40s.resource, 'nvidia.com/l40s');
    assert.deepEqual(await unlabelled(admin), []);
    assert.deepEqual(await contrastFailures(admin), []);
    await admin.locator('#aa-action').fill('');
    await admin.locator('#aa-filter').getByRole('button', { name: 'Filter' }).click();
    await admin.locator('#aa-list tr[data-action="model.put"]').first().waitFor();
    await admin.locator('#ab-model').selectOption('');
    await admin.locator('#ab-filter').getByRole('button', { name: 'Filter' }).click();
    await admin.waitForFunction(() => document.querySelectorAll('#ab-list tr[data-id]').length === 4); // with the seeded one
    await admin.evaluate(() => window.scrollTo(0, 0));
    await shot(admin, '05-admin.png');
    admin.assertClean();
  });

  it('a user token gets no admin view, and the API answers 403 if asked', async () => {
    await alice.goto(`${BASE}/#admin`);
    await alice.locator('#view-book').waitFor();
    assert.equal(await alice.locator('#view-admin').isVisible(), false);
    const status = await alice.evaluate(async (t) => (await fetch('/api/v1/audit', { headers: { Authorization: `Bearer ${t}` } })).status, USER_TOKEN);
    assert.equal(status, 403);
  });
});
