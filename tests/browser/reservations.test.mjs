// Course reservations on the Groups and courses view (reservations.js) and in the
// booking calendar (calendar.js), against `gpu-booking demo`, with the page served
// for a lab in Pacific/Auckland while the browser is in Europe/Berlin: a group's
// owner reserves weekly sessions in plain words (the page writes the RFC 5545 rule
// in the lab's zone); the calendar shows each session on its lab day, not its UTC
// day; one session is cancelled and its units are free again; a reservation that
// does not fit is refused in the API's words. The demo's seeded course, when the
// demo seeds one, is in session in the calendar. Leaves the screenshot that
// docs/reservations.png is copied from; removes what it made.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  ADMIN_TOKEN, USER_TOKEN, DAY_MS, launch, newPage, shot, api, waitReady, signInWithToken, unlabelled,
  contrastFailures,
} from './helpers.mjs';
import { tokenFor, answer, deleteGroups, signInInZone, inZone } from './course-helpers.mjs';

const ZONE = 'Pacific/Auckland';
const GROUP = 'ml102';
const OWNER = 'prof.courses@uni.example';
const TITLE = 'ML102 lab session';
let b;
let ownerToken;
const made = [];

// The lab date of the first Tuesday at least 8 days ahead.
function firstTuesday() {
  let date = inZone(new Date(Date.now() + 8 * DAY_MS), ZONE).date;
  while (new Date(`${date}T00:00:00Z`).getUTCDay() !== 2) {
    date = new Date(Date.parse(`${date}T00:00:00Z`) + DAY_MS).toISOString().slice(0, 10);
  }
  return date;
}

describe('course reservations', () => {
  before(async () => {
    await waitReady();
    b = await launch();
    await deleteGroups(GROUP);
    await api('POST', '/groups', ADMIN_TOKEN, { name: GROUP, description: 'Deep learning lab' });
    await api('PUT', `/groups/${GROUP}/members/${encodeURIComponent(OWNER)}`, ADMIN_TOKEN, { role: 'owner' });
    ownerToken = await tokenFor(OWNER);
  });

  after(async () => {
    for (const id of made) await answer('DELETE', `/reservations/${id}`, ADMIN_TOKEN);
    await deleteGroups(GROUP);
    if (b) await b.close();
  });

  it('an owner reserves weekly sessions in plain words; the calendar shows them on the lab\'s days', async () => {
    const page = await newPage(b.browser);
    await signInInZone(page, ownerToken, ZONE);
    await page.locator('#tab-groups').click();
    const form = page.locator('#cr-form');
    await form.waitFor();
    assert.match(await page.locator('#courses .hint').first().innerText(), /lab's time zone \(Pacific\/Auckland\)/);
    assert.deepEqual(await form.getByLabel('Group').locator('option').evaluateAll((o) => o.map((x) => x.value)), [GROUP],
      'an owner reserves for their own group only');
    const first = firstTuesday();
    await form.getByLabel('Title').fill(TITLE);
    await form.getByLabel('GPU model').selectOption('a6000');
    await form.getByLabel('Units per session').fill('1');
    await form.getByLabel('Tue').check();
    await form.getByLabel('From the week of').fill(first);
    await form.getByLabel(/^From\s*\(lab time\)/).fill('09:00');
    await form.getByLabel(/^To\s*\(lab time\)/).fill('11:00');
    await form.getByLabel('Number of weeks').fill('2');
    await page.locator('#cr-rrule', { hasText: 'FREQ=WEEKLY;BYDAY=TU;COUNT=2' }).waitFor();
    assert.match(await page.locator('#cr-summary').innerText(), /Tue, 09:00–11:00 \(Pacific\/Auckland\), for 2 weeks from .*: 2 sessions/);
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    await page.getByRole('button', { name: 'Reserve these sessions' }).click();
    await page.locator('#cr-ok').waitFor();
    assert.match(await page.locator('#cr-ok').innerText(), new RegExp(`Reserved: ${TITLE} for ${GROUP}, 2 sessions\\.`));

    // The API's state: the rule, the zone, and sessions at 09:00 on Tuesdays in Auckland.
    const r = (await api('GET', '/reservations', ADMIN_TOKEN)).find((x) => x.title === TITLE);
    assert.ok(r, 'the reservation is listed');
    made.push(r.id);
    assert.equal(r.rrule, 'FREQ=WEEKLY;BYDAY=TU;COUNT=2');
    assert.equal(r.time_zone, ZONE);
    assert.equal(r.group, GROUP);
    assert.equal(r.model, 'a6000');
    assert.equal(r.units, 1);
    assert.equal(r.occurrences.length, 2);
    for (const o of r.occurrences) {
      const at = inZone(o.start, ZONE);
      assert.equal(at.weekday, 'Tue');
      assert.equal(at.time, '09:00');
      assert.equal(inZone(o.end, ZONE).time, '11:00');
    }
    assert.equal(inZone(r.occurrences[0].start, ZONE).date, first);
    // Auckland's 09:00 is the day before in UTC: the lab day and the UTC day differ.
    const utcDay = new Date(r.occurrences[0].start).toISOString().slice(0, 10);
    assert.notEqual(utcDay, first);

    // The schedule lists both sessions, in lab time.
    const card = page.locator(`.course-card[data-reservation="${r.id}"]`);
    await card.waitFor();
    assert.match(await card.locator('.course-what').innerText(), /ml102: 1 × a6000, every Tue, 09:00–11:00 \(Pacific\/Auckland\), 2 sessions\./);
    assert.equal(await card.locator('tbody tr').count(), 2);
    assert.match(await card.locator('tbody tr').first().innerText(), /09:00–11:00[\s\S]*planned/);

    // The calendar: the session on its lab day (Tuesday), none on the UTC day before.
    await page.locator('#tabs a[data-view="book"]').click();
    const cell = page.locator(`table.calendar[data-model="a6000"] td[data-date="${first}"]`);
    await cell.locator('.hold-course').waitFor();
    assert.equal(await cell.locator('.hold-course').innerText(), `${TITLE} 09:00–11:00`);
    assert.match(await cell.getAttribute('class'), /has-course/);
    assert.ok(Number(await cell.getAttribute('data-free')) <= 3, 'the session\'s unit is not free that day');
    // (The demo's own course may have a session that day: only this one's counts.)
    assert.equal(await page.locator(`table.calendar[data-model="a6000"] td[data-date="${utcDay}"] .hold-course`, { hasText: TITLE }).count(), 0);
    assert.match(await page.locator('#cal-hint').innerText(), /lab's time zone, Pacific\/Auckland/);
    assert.deepEqual(await contrastFailures(page), [], 'every text has enough contrast');
    await cell.scrollIntoViewIfNeeded();
    await shot(page, 'reservations-02-calendar.png', false);
    page.assertClean();
    await page.context().close();
  });

  it('an owner cancels one session; a reservation that does not fit is refused in the API\'s words', async () => {
    const r = (await api('GET', '/reservations', ADMIN_TOKEN)).find((x) => x.title === TITLE);
    const page = await newPage(b.browser);
    await signInInZone(page, ownerToken, ZONE);
    await page.locator('#tab-groups').click();
    const row = page.locator(`.course-card[data-reservation="${r.id}"] tr[data-start="${r.occurrences[0].start}"]`);
    await row.getByRole('button', { name: /^Cancel this session/ }).click();
    assert.match(await page.locator('#confirm-text').innerText(), /09:00–11:00: its 1 unit is free again/);
    await page.locator('#confirm-yes').click();
    await page.locator(`.course-card[data-reservation="${r.id}"] tr[data-start="${r.occurrences[0].start}"][data-cancelled="true"]`).waitFor();
    assert.match(await page.locator(`.course-card[data-reservation="${r.id}"] .notice.ok`).innerText(), /cancelled\.$/);
    const after = await api('GET', `/reservations/${r.id}`, ADMIN_TOKEN);
    assert.deepEqual(after.occurrences.map((o) => o.cancelled), [true, false]);
    const first = inZone(r.occurrences[0].start, ZONE).date;
    await page.locator('#tabs a[data-view="book"]').click();
    await page.locator(`table.calendar[data-model="a6000"] td[data-date="${inZone(r.occurrences[1].start, ZONE).date}"] .hold-course`).waitFor();
    assert.equal(await page.locator(`table.calendar[data-model="a6000"] td[data-date="${first}"] .hold-course`).count(), 0,
      'the cancelled session left the calendar');

    // Every a6000 unit on the same sessions: the second (still held) does not fit.
    const body = {
      group: GROUP, title: 'ML102 exam', model: 'a6000', units: 4,
      start: `${first}T09:00:00`, end: `${first}T11:00:00`, rrule: 'FREQ=WEEKLY;BYDAY=TU;COUNT=2', time_zone: ZONE, skip_conflicts: false,
    };
    const refused = await answer('POST', '/reservations', ownerToken, body);
    assert.equal(refused.status, 409, JSON.stringify(refused.body));
    await page.locator('#tab-groups').click();
    const form = page.locator('#cr-form');
    await form.getByLabel('Title').fill(body.title);
    await form.getByLabel('GPU model').selectOption('a6000');
    await form.getByLabel('Units per session').fill('4');
    await form.getByLabel('Tue').check();
    await form.getByLabel('From the week of').fill(first);
    await form.getByLabel(/^From\s*\(lab time\)/).fill('09:00');
    await form.getByLabel(/^To\s*\(lab time\)/).fill('11:00');
    await form.getByLabel('Number of weeks').fill('2');
    await page.getByRole('button', { name: 'Reserve these sessions' }).click();
    const problem = page.locator('#cr-result .notice.error');
    await problem.waitFor();
    assert.match(await problem.innerText(), /^Not reserved\./);
    assert.equal(await problem.locator('q').innerText(), refused.body.message);
    assert.match(refused.body.message, /Occurrence 2 .* does not fit/);
    assert.equal((await api('GET', '/reservations', ADMIN_TOKEN)).filter((x) => x.title === body.title).length, 0, 'nothing made');
    await page.locator('#courses').scrollIntoViewIfNeeded();
    await shot(page, 'reservations-01-schedule.png');
    page.assertClean();
    await page.context().close();
  });

  it('a member sees the schedule but cannot change it', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    await page.locator('#tab-groups').click();
    const r = (await api('GET', '/reservations', USER_TOKEN)).find((x) => x.title === TITLE);
    const card = page.locator(`.course-card[data-reservation="${r.id}"]`);
    await card.waitFor();
    assert.equal(await card.getByRole('button').count(), 0, 'no cancel or remove buttons');
    assert.equal(await page.locator('#cr-form').isVisible(), false);
    const refused = await answer('DELETE', `/reservations/${r.id}`, USER_TOKEN);
    assert.equal(refused.status, 403);
    page.assertClean();
    await page.context().close();
  });

  it('the demo\'s seeded course is in session in the calendar', async (t) => {
    const seeded = (await api('GET', '/reservations', USER_TOKEN)).find((x) => x.title === 'ML101 lab session');
    if (!seeded) {
      t.skip('this demo seeds no course (sim::course_seed::seed is not called by src/demo.rs)');
      return;
    }
    const now = Date.now();
    const running = seeded.occurrences.find((o) => !o.cancelled && Date.parse(o.start) <= now && now < Date.parse(o.end));
    assert.ok(running, 'a session runs now');
    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    const today = new Date().toISOString().slice(0, 10);
    await page.locator(`table.calendar[data-model="${seeded.model}"] td[data-date="${today}"] .hold-course`, { hasText: 'ML101 lab session' }).waitFor();
    await page.locator('#tab-groups').click();
    await page.locator(`.course-card[data-reservation="${seeded.id}"] .badge`, { hasText: 'in session now' }).waitFor();
    page.assertClean();
    await page.context().close();
  });
});
