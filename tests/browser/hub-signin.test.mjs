// "Sign in with JupyterHub" in a browser, against a real JupyterHub (PyPI, under
// target/jupyterhub; ./scripts/jupyterhub-tools.sh installs it) and the API binary
// run as a lab would run it: `gpu-booking api --hub-login-url ...` on a database of
// its own. The sign-in view shows one button; the hub's login form signs the user
// in; the page comes back signed in under the hub's name and books.
// Skipped, with a message, without the hub, unless GPU_BOOKING_REQUIRE_JUPYTERHUB=1.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { launch, newPage, shot } from './helpers.mjs';

const ROOT = path.resolve(process.env.REPO_ROOT || '../..');
const BIN = process.env.GPU_BOOKING_BIN || path.join(ROOT, 'target/debug/gpu-booking');
const HUB = path.join(ROOT, 'target/jupyterhub/venv/bin/jupyterhub');
const PGHOST = process.env.PGHOST || '127.0.0.1';
const REQUIRED = process.env.GPU_BOOKING_REQUIRE_JUPYTERHUB === '1';
const PASSWORD = 'a-shared-test-password';
const present = fs.existsSync(HUB);
if (!present && REQUIRED) throw new Error(`${HUB} is missing: run ./scripts/jupyterhub-tools.sh`);
if (!present) console.log('SKIPPED: the JupyterHub sign-in browser test: target/jupyterhub is missing');

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

async function waitFor(url, what) {
  const deadline = Date.now() + 60000;
  for (;;) {
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch (e) { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`${what} did not answer on ${url}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

function psql(sql) {
  execFileSync('psql', ['-h', PGHOST, '-p', '5432', '-U', 'postgres', '-d', 'postgres', '-v', 'ON_ERROR_STOP=1', '-qAtc', sql]);
}

describe('sign in with JupyterHub', { skip: !present }, () => {
  const db = `gpu_booking_hub_signin_${process.pid}_${Date.now()}`;
  const secret = crypto.randomBytes(32).toString('hex');
  const clientSecret = crypto.randomBytes(16).toString('hex');
  const hubDir = fs.mkdtempSync(path.join(os.tmpdir(), 'hub-signin-'));
  let api; let hub; let page; let hubUrl; let b;
  const children = [];

  before(async () => {
    psql(`CREATE DATABASE ${db}`);
    const [apiPort, hubPort] = [await freePort(), await freePort()];
    page = `http://127.0.0.1:${apiPort}`;
    hubUrl = `http://127.0.0.1:${hubPort}`;
    const log = fs.openSync(path.join(ROOT, 'artifacts/browser-hub-signin.log'), 'w');
    api = spawn(BIN, ['api', '--listen', `127.0.0.1:${apiPort}`, '--page-url', `${page}/`,
      '--hub-login-url', `${hubUrl}/`, '--hub-login-admin-group', 'gpu-admins'], {
      env: {
        ...process.env,
        DATABASE_URL: `postgres://postgres@${PGHOST}:5432/${db}`,
        GPU_BOOKING_JWT_SECRET: secret,
        GPU_BOOKING_HUB_LOGIN_SECRET: clientSecret,
      },
      stdio: ['ignore', log, log],
    });
    hub = spawn(HUB, ['-f', path.join(ROOT, 'tests/jupyterhub/jupyterhub_config.py')], {
      cwd: hubDir,
      env: {
        ...process.env, HUB_PORT: String(hubPort), HUB_DIR: hubDir, BOOKING_URL: page, HUB_BOOKING_SECRET: clientSecret, HUB_PASSWORD: PASSWORD,
        // The controller's services of tests/jupyterhub/jupyterhub_config.py, unused here.
        HUB_CONTROLLER_TOKEN: crypto.randomBytes(16).toString('hex'), HUB_READ_ONLY_TOKEN: crypto.randomBytes(16).toString('hex'),
        HUB_ADMIN_TOKEN: crypto.randomBytes(16).toString('hex'),
      },
      stdio: ['ignore', log, log],
    });
    children.push(api, hub);
    await waitFor(`${page}/readyz`, 'the booking API');
    await waitFor(`${hubUrl}/hub/api/`, 'JupyterHub');
    const admin = execFileSync(BIN, ['token', '--user', 'admin@example.com', '--role', 'admin', '--jwt-secret', secret]).toString().trim();
    const r = await fetch(`${page}/api/v1/models/a100`, {
      method: 'PUT',
      headers: { Authorization: `Bearer ${admin}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ units: 2, patterns: ['*A100*'] }),
    });
    assert.equal(r.status, 200, 'the model is declared');
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
    for (const c of children) c.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 500));
    try { psql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`); } catch (e) { /* reported by the run */ }
    fs.rmSync(hubDir, { recursive: true, force: true });
  });

  it('one button, the hub\'s login, back signed in under the hub\'s name, books', async () => {
    const p = await newPage(b.browser, { allowOrigins: [page, hubUrl] });
    await p.goto(`${page}/#book`);
    const signin = p.locator('#view-signin');
    await signin.waitFor();
    // A production install shows the one way it has; the token box is folded away.
    assert.ok(await p.locator('#hub-signin').isVisible(), 'the JupyterHub button is shown');
    assert.equal(await p.locator('#oidc-signin').isVisible(), false, 'no single sign-on card');
    assert.equal(await p.locator('#proxy-signin').isVisible(), false, 'no proxy card');
    assert.equal(await p.locator('#token-signin').getAttribute('open'), null, 'the token box is folded');
    assert.equal(await p.locator('#token-input').isVisible(), false);
    await shot(p, 'hub-signin.png');

    await p.getByRole('link', { name: 'Sign in with JupyterHub' }).click();
    // The hub's own login form (SharedPasswordAuthenticator here; LDAP or GitHub in a lab).
    await p.waitForURL(new RegExp(`^${hubUrl}/hub/login`));
    await p.locator('#username_input').fill('Alice');
    await p.locator('#password_input').fill(PASSWORD);
    await p.locator('#login_submit').click();
    // Back on the page, signed in as the hub names her, the token gone from the address.
    const who = p.locator('#who-text');
    await who.waitFor();
    assert.equal(await who.innerText(), 'Signed in as alice');
    assert.equal(new URL(p.url()).origin, page);
    assert.doesNotMatch(p.url(), /hub-token/, 'the token leaves the address bar');
    assert.equal(new URL(p.url()).hash, '#book', 'back on the view the sign-in started from');

    await p.locator('#book-form').getByLabel('GPU model').selectOption('a100');
    await p.locator('#book-earliest', { hasText: 'you can start right away' }).waitFor();
    await p.getByRole('button', { name: 'Book', exact: true }).click();
    await p.locator('#book-ok').waitFor();
    assert.match(await p.locator('#book-ok').innerText(), /^Booked: a100 from /);
    const token = await p.evaluate(() => sessionStorage.getItem('gpu-booking-token'));
    const mine = await (await fetch(`${page}/api/v1/bookings`, { headers: { Authorization: `Bearer ${token}` } })).json();
    assert.equal(mine.length, 1);
    assert.equal(mine[0].user, 'alice', 'booked under the name KubeSpawner writes on her pods');
    p.assertClean();
  });
});
