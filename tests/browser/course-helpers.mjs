// Shared by the groups, reservations and maintenance browser tests: tokens for any
// user (the demo's sign-in route), API answers with their status, the page served
// with a lab time zone, and clean-up of what a test made.
import { BASE, ADMIN_TOKEN, signInWithToken } from './helpers.mjs';

// A token for `user` from the demo's own sign-in route (`gpu-booking demo` only).
export async function tokenFor(user, admin = false) {
  const res = await fetch(`${BASE}/demo/sign-in`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ user, admin }),
  });
  const data = await res.json();
  if (!res.ok) throw new Error(`demo sign-in of ${user}: ${res.status} ${JSON.stringify(data)}`);
  return data.token;
}

// An API call's status and body, whatever the status.
export async function answer(method, p, token, body) {
  const res = await fetch(`${BASE}/api/v1${p}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: res.status, body: await res.json().catch(() => null) };
}

// Serves the page with `zone` as the lab's time zone (the server's
// `gpu-booking-time-zone`), then signs in.
export async function signInInZone(page, token, zone) {
  await page.route(`${BASE}/`, async (route) => {
    const res = await route.fetch();
    // Whatever zone the server fills in (`--time-zone`, UTC by default).
    const html = (await res.text()).replace(
      /<meta name="gpu-booking-time-zone" content="[^"]*">/,
      `<meta name="gpu-booking-time-zone" content="${zone}">`);
    await route.fulfill({ response: res, body: html });
  });
  await signInWithToken(page, token);
}

// Deletes groups by name (missing ones are fine).
export async function deleteGroups(...names) {
  for (const n of names) await answer('DELETE', `/groups/${encodeURIComponent(n)}`, ADMIN_TOKEN);
}

// `YYYY-MM-DD` and `HH:MM` of `instant` in `zone`.
export function inZone(instant, zone) {
  const p = Object.fromEntries(new Intl.DateTimeFormat('en-CA', {
    timeZone: zone, year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', hourCycle: 'h23', weekday: 'short',
  }).formatToParts(new Date(instant)).map((x) => [x.type, x.value]));
  return { date: `${p.year}-${p.month}-${p.day}`, time: `${p.hour}:${p.minute}`, weekday: p.weekday };
}
