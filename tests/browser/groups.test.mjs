// Groups, their rules and quotas on the Groups and courses view (groups.js,
// policy.js), against `gpu-booking demo`: an admin creates two groups, orders them,
// sets one's rules and quota and adds members; the API's refusal is shown in its own
// words; a member sees their groups, the sentence of the rules that apply to them
// (here and under the booking form) and each group's quota left; reordering the
// groups changes whose rules apply; an owner manages members only. Leaves the
// screenshot that docs/groups.png is copied from; deletes its groups at the end.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BASE, ADMIN_TOKEN, USER_TOKEN, USER, ADMIN, launch, newPage, shot, api, waitReady, signInWithToken, unlabelled,
  contrastFailures,
} from './helpers.mjs';
import { tokenFor, answer, deleteGroups } from './course-helpers.mjs';

const OWNER = 'prof.groups@uni.example';
const STUDENT = 'student.groups@uni.example';
let b;

describe('groups, rules and quotas', () => {
  before(async () => {
    await waitReady();
    b = await launch();
    await deleteGroups('ml-lab', 'vision');
  });

  after(async () => {
    await deleteGroups('ml-lab', 'vision');
    if (b) await b.close();
  });

  it('an admin creates groups, sets rules, quota and members; a refusal is in the API\'s words', async () => {
    const page = await newPage(b.browser);
    await signInWithToken(page, ADMIN_TOKEN);
    await page.locator('#tab-groups').click();
    const manage = page.locator('#manage-groups');
    await manage.locator('#gm-new').waitFor();

    // A name the API refuses: the page shows the API's message.
    const refused = await answer('POST', '/groups', ADMIN_TOKEN, { name: '-bad-' });
    assert.equal(refused.status, 422);
    await page.getByLabel('New group\'s name').fill('-bad-');
    await page.getByRole('button', { name: 'Create group' }).click();
    const problem = manage.locator('#gm-new .notice.error');
    await problem.waitFor();
    assert.equal(await problem.locator('q').innerText(), refused.body.message);
    assert.match(await problem.innerText(), /^Not created\./);

    // Before the demo's seeded course (order 0), when there is one.
    for (const [name, order] of [['ml-lab', '-2'], ['vision', '5']]) {
      await page.getByLabel('New group\'s name').fill(name);
      await page.locator('#gm-new-position').fill(order);
      await page.getByRole('button', { name: 'Create group' }).click();
      await manage.locator(`section.group-card[data-group="${name}"]`).waitFor();
      assert.match(await page.locator('#gm-result-top').innerText(), new RegExp(`Created ${name}`));
    }
    const listed = (await api('GET', '/groups', ADMIN_TOKEN)).map((g) => [g.name, g.position]);
    assert.deepEqual(listed.filter(([n]) => n === 'ml-lab' || n === 'vision'), [['ml-lab', -2], ['vision', 5]]);

    // ml-lab's rules and quota.
    const form = manage.locator('form.group-form[data-group="ml-lab"]');
    await form.getByLabel('Longest booking (days)').fill('7');
    await form.getByLabel('GPU-hours per period').fill('100');
    await form.getByLabel('Units held at once').fill('2');
    await form.getByRole('button', { name: 'Save ml-lab' }).click();
    await manage.locator('form.group-form[data-group="ml-lab"] .notice.ok', { hasText: 'Saved ml-lab.' }).waitFor();
    const mlLab = await api('GET', '/groups/ml-lab', ADMIN_TOKEN);
    assert.equal(mlLab.policy.max_duration_seconds, 7 * 86400);
    assert.equal(mlLab.policy.cooldown_seconds, null, 'an empty field inherits the lab\'s');
    assert.deepEqual({ gpu_hours: mlLab.quota.gpu_hours, units: mlLab.quota.units, period: mlLab.quota.period }, { gpu_hours: 100, units: 2, period: 'month' });

    // Members: the user and the admin in ml-lab, the user in vision, an owner of ml-lab.
    const members = manage.locator('.members[data-group="ml-lab"]');
    for (const [user, role] of [[USER, 'member'], [ADMIN, 'member'], [OWNER, 'owner']]) {
      await members.getByLabel('Add a member (user name or e-mail)').fill(user);
      await members.getByLabel('Role').selectOption(role);
      await members.getByRole('button', { name: 'Add to ml-lab' }).click();
      await manage.locator(`.members[data-group="ml-lab"] tr[data-user="${user}"]`).waitFor();
    }
    const vision = manage.locator('.members[data-group="vision"]');
    await vision.getByLabel('Add a member (user name or e-mail)').fill(USER);
    await vision.getByRole('button', { name: 'Add to vision' }).click();
    await manage.locator(`.members[data-group="vision"] tr[data-user="${USER}"]`).waitFor();
    const got = (await api('GET', '/groups/ml-lab', ADMIN_TOKEN)).members.map((m) => [m.user, m.role, m.source]).sort();
    assert.deepEqual(got, [[ADMIN, 'member', 'admin'], [USER, 'member', 'admin'], [OWNER, 'owner', 'admin']].sort());

    // The admin is a member now: their own rules and quota show at the top.
    await page.reload();
    await page.locator('#mg-body tr[data-group="ml-lab"] .quota-cell', { hasText: 'GPU-hours left' }).waitFor();
    assert.deepEqual(await unlabelled(page), [], 'every control has a label');
    assert.deepEqual(await contrastFailures(page), [], 'every text has enough contrast');
    await shot(page, 'groups-01-admin.png');
    page.assertClean();
    await page.context().close();
  });

  it('a member sees their groups, the rules that apply and the quota left; the order decides', async () => {
    const policy = await api('GET', '/policy', USER_TOKEN);
    assert.equal(policy.group, 'ml-lab');
    const a100 = policy.models.find((m) => m.model === 'a100');
    assert.match(a100.sentence, /^As a member of ml-lab you may book up to 7 days of an a100/);
    const usage = await api('GET', '/groups/ml-lab/usage', USER_TOKEN);

    const page = await newPage(b.browser);
    await signInWithToken(page, USER_TOKEN);
    // Under the booking form: the sentence for the chosen model and the quota left.
    await page.locator('#book-form').getByLabel('GPU model').selectOption('a100');
    const line = page.locator('#book-policy');
    await line.locator('.policy-sentence', { hasText: a100.sentence }).waitFor();
    await line.locator('.quota-left', { hasText: 'GPU-hours left' }).waitFor();
    assert.match(await line.innerText(), new RegExp(`Quota of ml-lab: ${usage.left_gpu_hours} of 100 GPU-hours left in ${usage.period}`));

    await page.locator('#tab-groups').click();
    const mine = page.locator('#my-groups');
    await mine.locator('tr[data-group="vision"] .quota-cell', { hasText: 'no quota' }).waitFor();
    assert.deepEqual((await mine.locator('tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.group))).filter((g) => g !== 'ml101'), ['ml-lab', 'vision']);
    assert.match(await mine.locator('tr[data-group="ml-lab"]').innerText(), /ml-lab\s+member\s+added by an admin\s+apply to you/);
    assert.match(await mine.locator('tr[data-group="ml-lab"] .quota-cell').innerText(),
      new RegExp(`^${usage.left_gpu_hours} of 100 GPU-hours left in ${usage.period} .*; 0 of 2 units held now`));
    for (const m of policy.models) {
      assert.equal(await mine.locator(`#mg-policy li[data-model="${m.model}"]`).innerText(), m.sentence);
    }
    // A member manages nothing.
    assert.equal(await page.locator('#manage-groups').isVisible(), false);
    assert.equal(await page.locator('#cr-form').isVisible(), false);

    // The admin puts vision first: its rules (the lab's) apply now.
    const v = await api('GET', '/groups/vision', ADMIN_TOKEN);
    await api('PUT', '/groups/vision', ADMIN_TOKEN, { position: -3, description: v.description, policy: v.policy, models: v.models, quota: v.quota });
    await page.locator('#tab-book').or(page.locator('#tabs a[data-view="book"]')).first().click();
    await page.locator('#tab-groups').click();
    await mine.locator('tr[data-group="vision"] .applies').waitFor();
    assert.match(await mine.locator('#mg-policy li[data-model="a100"]').innerText(), /^As a member of vision you may book up to/);
    assert.equal((await api('GET', '/policy', USER_TOKEN)).group, 'vision');
    await shot(page, 'groups-02-member.png');
    page.assertClean();
    await page.context().close();
  });

  it('an owner manages the group\'s members, not its rules', async () => {
    const token = await tokenFor(OWNER);
    const page = await newPage(b.browser);
    await signInWithToken(page, token);
    await page.locator('#tab-groups').click();
    const manage = page.locator('#manage-groups');
    const members = manage.locator('.members[data-group="ml-lab"]');
    await members.waitFor();
    assert.equal(await manage.locator('form.group-form').count(), 0, 'no rules form for owners');
    assert.equal(await manage.locator('#gm-new').count(), 0, 'owners create no groups');
    assert.equal(await manage.locator('section.group-card').count(), 1, 'only their group');
    assert.deepEqual(await members.getByLabel('Role').locator('option').evaluateAll((o) => o.map((x) => x.value)), ['member']);
    await members.getByLabel('Add a member (user name or e-mail)').fill(STUDENT);
    await members.getByRole('button', { name: 'Add to ml-lab' }).click();
    await manage.locator(`.members[data-group="ml-lab"] tr[data-user="${STUDENT}"]`).waitFor();
    assert.ok((await api('GET', '/groups/ml-lab', ADMIN_TOKEN)).members.some((m) => m.user === STUDENT && m.role === 'member'));

    // Removing the student again, through the confirmation.
    await manage.locator(`.members[data-group="ml-lab"] tr[data-user="${STUDENT}"]`).getByRole('button', { name: /^Remove/ }).click();
    await page.locator('#confirm-yes').click();
    await manage.locator(`.members[data-group="ml-lab"] tr[data-user="${STUDENT}"]`).waitFor({ state: 'detached' });
    assert.ok(!(await api('GET', '/groups/ml-lab', ADMIN_TOKEN)).members.some((m) => m.user === STUDENT));
    page.assertClean();
    await page.context().close();
  });
});
