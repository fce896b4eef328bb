// Shared by the browser tests: the environment run.sh sets up, the browser,
// API calls from the test side, and time helpers.
import fs from 'node:fs';
import path from 'node:path';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

export const BASE = mustEnv('BASE_URL').replace(/\/+$/, '');
export const USER_TOKEN = mustEnv('USER_TOKEN');
export const ADMIN_TOKEN = mustEnv('ADMIN_TOKEN');
export const USER = 'alice@example.com';
export const ADMIN = 'admin@example.com';
export const SHOTS = process.env.SCREENSHOT_DIR || path.resolve('artifacts/screenshots');
// The browser's time zone in every test: the page shows local time, the API UTC.
export const TZ = 'Europe/Berlin';
export const DAY_MS = 86400000;

function mustEnv(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run the tests through tests/browser/run.sh`);
  return v;
}

// Debian's Chromium, never a downloaded one. playwright-core adds --headless and
// a fresh temporary --user-data-dir (removed on close) itself.
export async function launch() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  return { browser, close: () => browser.close() };
}

// A page that fails the test on a script error, a CSP violation, or a request
// to any origin but the service's (and those the test allows).
export async function newPage(browser, opts = {}) {
  const { allowOrigins = [], ...contextOpts } = opts;
  const context = await browser.newContext({
    viewport: { width: 1280, height: 900 },
    timezoneId: TZ,
    locale: 'en-GB',
    ...contextOpts,
  });
  context.setDefaultTimeout(10000);
  const page = await context.newPage();
  const problems = [];
  const allowed = new Set([new URL(BASE).origin, ...allowOrigins]);
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (/Content Security Policy|Refused to/i.test(m.text())) problems.push(`CSP: ${m.text()}`);
  });
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.protocol.startsWith('http') && !allowed.has(u.origin)) problems.push(`request to another origin: ${r.url()}`);
  });
  page.problems = problems;
  page.assertClean = () => assert.deepEqual(problems, [], 'no script errors, CSP violations or foreign requests');
  return page;
}

export async function shot(page, name, fullPage = true) {
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, name), fullPage });
}

export async function api(method, p, token, body) {
  const res = await fetch(`${BASE}/api/v1${p}`, {
    method,
    headers: {
      Authorization: `Bearer ${token}`,
      ...(body ? { 'Content-Type': 'application/json' } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = await res.json().catch(() => null);
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${JSON.stringify(data)}`);
  return data;
}

export async function waitReady() {
  const deadline = Date.now() + 20000;
  for (;;) {
    try {
      const r = await fetch(`${BASE}/readyz`);
      if (r.ok) return;
    } catch (e) { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`${BASE} is not ready`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// The value a datetime-local input shows for `d` in the test's time zone.
export function localInput(d) {
  const p = Object.fromEntries(new Intl.DateTimeFormat('en-CA', {
    timeZone: TZ, year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', hourCycle: 'h23',
  }).formatToParts(d).map((x) => [x.type, x.value]));
  return `${p.year}-${p.month}-${p.day}T${p.hour}:${p.minute}`;
}

// Hour and minute in the test's time zone, as the page prints them.
export function localClock(d) {
  return new Intl.DateTimeFormat('en-GB', { timeZone: TZ, hour: '2-digit', minute: '2-digit', hourCycle: 'h23' }).format(d);
}

export function ceilMinute(d) {
  return new Date(Math.ceil(new Date(d).getTime() / 60000) * 60000);
}

export function utcDate(d) {
  return new Date(d).toISOString().slice(0, 10);
}

export async function signInWithToken(page, token) {
  await page.goto(`${BASE}/`);
  await page.getByLabel('Bearer token').fill(token);
  await page.getByRole('button', { name: 'Sign in with this token' }).click();
  await page.locator('#who-text').waitFor();
}

// The free-unit number a calendar cell shows, checked against its text.
export async function calendarFree(page, model, date) {
  const cell = page.locator(`table.calendar[data-model="${model}"] td[data-date="${date}"]`);
  const free = Number(await cell.getAttribute('data-free'));
  const shown = await cell.locator('.free').innerText();
  assert.match(shown.replace(/\s+/g, ''), new RegExp(`^${free}/\\d+$`), `cell ${model} ${date} shows its number`);
  return free;
}

// WCAG contrast of every visible text against its effective background.
export async function contrastFailures(page) {
  return page.evaluate(() => {
    const parse = (c) => {
      const m = c.match(/rgba?\(([^)]+)\)/);
      if (!m) return null;
      const [r, g, b, a = 1] = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
      return { r, g, b, a };
    };
    const lum = ({ r, g, b }) => {
      const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const bgOf = (el) => {
      for (let n = el; n; n = n.parentElement) {
        const cs = getComputedStyle(n);
        const bg = parse(cs.backgroundColor);
        if (bg && bg.a > 0.5) return bg;
        if (cs.backgroundImage && cs.backgroundImage !== 'none' && n !== el) break;
      }
      return { r: 255, g: 255, b: 255, a: 1 };
    };
    const fails = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      const el = t.parentElement;
      if (!t.textContent.trim() || !el || !el.checkVisibility() || el.closest('.sr-only')) continue;
      const fg = parse(getComputedStyle(el).color);
      const bg = bgOf(el);
      if (!fg) continue;
      const [l1, l2] = [lum(fg), lum(bg)].sort((a, b) => b - a);
      const ratio = (l1 + 0.05) / (l2 + 0.05);
      if (ratio < 4.5) fails.push(`${ratio.toFixed(2)}: "${t.textContent.trim().slice(0, 40)}" (${el.tagName.toLowerCase()}.${el.className})`);
    }
    return fails;
  });
}

// Every form control has a label (a <label>, aria-label or aria-labelledby).
export async function unlabelled(page) {
  return page.evaluate(() => [...document.querySelectorAll('input, select, textarea')]
    .filter((c) => c.type !== 'hidden' && !(c.labels && c.labels.length) && !c.getAttribute('aria-label') && !c.getAttribute('aria-labelledby'))
    .map((c) => c.id || c.outerHTML.slice(0, 60)));
}
