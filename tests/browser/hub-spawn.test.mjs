// A server started from a real JupyterHub's spawn form, in a browser: `gpu-booking
// demo --jupyterhub` (its own database and ports) runs the hub (PyPI, under
// target/jupyterhub; ./scripts/jupyterhub-tools.sh installs it) with KubeSpawner
// spawning into the demo's lab. The booked sample user logs in at the hub's form, the
// spawn form shows the availability (the screenshot docs/hub-spawn.png is copied
// from), the user starts the booked GPU profile, the hub shows the server running,
// and the lab runs it booked on an a100.
// Skipped, with a message, without the hub, unless GPU_BOOKING_REQUIRE_JUPYTERHUB=1.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
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
const present = fs.existsSync(HUB);
if (!present && REQUIRED) throw new Error(`${HUB} is missing: run ./scripts/jupyterhub-tools.sh`);
if (!present) console.log('SKIPPED: the hub spawn browser test: target/jupyterhub is missing');

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

function psql(sql) {
  execFileSync('psql', ['-h', PGHOST, '-p', '5432', '-U', 'postgres', '-d', 'postgres', '-v', 'ON_ERROR_STOP=1', '-qAtc', sql]);
}

// The demo's printed lines, once it says it is up.
async function started(logPath, demo) {
  const deadline = Date.now() + 180000;
  for (;;) {
    const text = fs.existsSync(logPath) ? fs.readFileSync(logPath, 'utf8') : '';
    if (text.includes('Ctrl-C stops it')) return text;
    if (demo.exitCode !== null) throw new Error(`the demo exited:\n${text}`);
    if (Date.now() > deadline) throw new Error(`the demo did not start:\n${text}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('a server from the real hub\'s spawn form', { skip: !present }, () => {
  const db = `gpu_booking_hub_spawn_${process.pid}_${Date.now()}`;
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'hub-spawn-'));
  let demo; let b; let api; let hub; let password; let user;

  before(async () => {
    psql(`CREATE DATABASE ${db}`);
    const ports = [];
    for (let i = 0; i < 5; i += 1) ports.push(await freePort());
    api = `http://127.0.0.1:${ports[0]}`;
    const logPath = path.join(ROOT, 'artifacts/browser-hub-spawn.log');
    const log = fs.openSync(logPath, 'w');
    demo = spawn(BIN, ['demo', '--jupyterhub', '--jupyterhub-port', String(ports[4]),
      '--jupyterhub-dir', path.join(scratch, 'hub'), '--listen', `127.0.0.1:${ports[0]}`,
      '--webhook-listen', `127.0.0.1:${ports[1]}`, '--webhook-admin-listen', `127.0.0.1:${ports[2]}`,
      '--apiserver-listen', `127.0.0.1:${ports[3]}`, '--cert-dir', path.join(scratch, 'certs')], {
      cwd: ROOT,
      env: { ...process.env, DATABASE_URL: `postgres://postgres@${PGHOST}:5432/${db}` },
      stdio: ['ignore', log, log],
    });
    const text = await started(logPath, demo);
    const line = text.split('\n').find((l) => l.includes('JupyterHub:'));
    assert.ok(line, `the demo printed no JupyterHub line:\n${text}`);
    hub = line.match(/(http:\/\/\S+)\/hub\/login/)[1];
    password = line.match(/password: ([^)\s]+)/)[1];
    user = text.match(/log in as (\S+)/)[1];
    b = await launch();
  });

  after(async () => {
    if (b) await b.close();
    if (demo) demo.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 1000));
    try { psql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`); } catch (e) { /* reported by the run */ }
    fs.rmSync(scratch, { recursive: true, force: true });
  });

  it('logs in, sees the availability, starts the booked GPU and sees it running', async () => {
    const p = await newPage(b.browser, { allowOrigins: [hub, api] });
    await p.goto(`${hub}/hub/login`);
    await p.locator('#username_input').fill(user);
    await p.locator('#password_input').fill(password);
    await p.locator('#login_submit').click();
    await p.waitForURL(/\/hub\//);
    await p.goto(`${hub}/hub/spawn`);
    // docs/jupyterhub/gpu_booking_profiles.py's profiles, from the booking API.
    const booked = p.locator('#kubespawner-profiles-list label', { hasText: 'Your booked a100 GPU (until' });
    await booked.waitFor();
    assert.ok(await booked.locator('input[type=radio]').isChecked(), 'the booked GPU is the default');
    await p.locator('#kubespawner-profiles-list', { hasText: 'CPU only' }).waitFor();
    await shot(p, 'hub-spawn.png');

    await p.getByRole('button', { name: 'Start' }).click();
    // Once the server is up the hub sends the browser on to it (nothing proxies it
    // here): the hub's home page says whether it runs.
    await p.waitForURL((u) => !u.pathname.endsWith('/hub/spawn'), { timeout: 60000 });
    await p.goto(`${hub}/hub/home`);
    await p.locator('#stop').waitFor({ timeout: 60000 });
    // ... and the lab runs it booked, on its a100.
    const deadline = Date.now() + 60000;
    let pod;
    for (;;) {
      const view = await (await fetch(`${api}/demo/cluster`)).json();
      pod = view.nodes.flatMap((n) => n.pods).find((x) => x.user === user && x.phase === 'Running');
      if (pod && pod.kind === 'booked') break;
      assert.ok(Date.now() < deadline, `${user}'s hub server never ran booked: ${JSON.stringify(view)}`);
      await new Promise((r) => setTimeout(r, 300));
    }
    assert.equal(pod.model, 'a100');
    assert.equal(pod.gpus, 1);
  });
});
