// The rules that apply to the signed-in user and their groups' quotas: one sentence
// under the booking form's model ("As a member of ml-lab you may book up to 7 days
// of an a100, ..."), and the "My groups, rules and quota" card on the Groups and
// courses view. The API decides which group's rules apply (GET /api/v1/policy) and
// counts the quotas (GET /api/v1/groups/{name}/usage); this only shows them.
'use strict';

(function () {
  const { el, call } = window.gpuBookingDom;
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;

  const SOURCES = {
    admin: 'added by an admin',
    oidc: "your sign-in's groups",
    hub: "JupyterHub's groups",
  };

  let policy = null;
  let usages = new Map();
  let seq = 0;

  function num(n) {
    return Number(n).toLocaleString(undefined, { maximumFractionDigits: 2 });
  }

  function fmtDate(t) {
    return new Date(t).toLocaleDateString(undefined, { day: 'numeric', month: 'short', year: 'numeric' });
  }

  // A group's use against its quota, in words.
  function quotaText(u) {
    const parts = [];
    const q = u.quota || {};
    if (q.gpu_hours !== null && q.gpu_hours !== undefined) {
      if (u.period) {
        parts.push(num(u.left_gpu_hours) + ' of ' + num(q.gpu_hours) + ' GPU-hours left in ' + u.period +
          (u.period_end ? ' (until ' + fmtDate(u.period_end) + ')' : '') + ', ' + num(u.used_gpu_hours) + ' booked');
      } else {
        parts.push('GPU-hours not limited now (no term runs)');
      }
    }
    if (q.units !== null && q.units !== undefined) {
      parts.push(u.units_now + ' of ' + q.units + (q.units === 1 ? ' unit' : ' units') + ' held now, at most ' + u.units_peak_ahead + ' ahead');
    }
    return parts.length ? parts.join('; ') : 'no quota';
  }

  function errorNote(e, what) {
    return el('div', { class: 'notice error', 'data-code': e.code || '' },
      el('p', {}, el('strong', { text: what + '. ' })),
      el('p', { class: 'api-message' }, 'The booking service says: ', el('q', { text: e.message })));
  }

  // The sentence for the booking form's model, with the applying group's quota.
  function renderBook() {
    const box = $('book-policy');
    if (!box) return;
    if (!policy) { box.replaceChildren(); return; }
    const m = policy.models.find((x) => x.model === $('book-model').value);
    const quota = policy.quota ? usages.get(policy.group) || policy.quota : null;
    box.replaceChildren(...[
      m ? el('span', { class: 'policy-sentence' + (m.allowed ? '' : ' not-allowed'), text: m.sentence }) : null,
      quota ? el('span', { class: 'quota-left', text: ' Quota of ' + policy.group + ': ' + quotaText(quota) + '.' }) : null,
    ].filter(Boolean));
  }

  function renderMine() {
    const box = $('mg-body');
    if (!box || !policy) return;
    if (!policy.groups.length) {
      box.replaceChildren(el('p', { class: 'muted', id: 'mg-none', text: "You are in no group: the lab's rules apply to you." }),
        sentences());
      return;
    }
    const rows = policy.groups.map((g, i) => {
      const u = usages.get(g.name);
      return el('tr', { 'data-group': g.name },
        el('th', { scope: 'row', 'data-label': 'Group', text: g.name }),
        el('td', { 'data-label': 'Role', text: g.role === 'owner' ? 'owner' : 'member' }),
        el('td', { 'data-label': 'From', text: SOURCES[g.source] || g.source }),
        el('td', { 'data-label': 'Rules' }, g.name === policy.group
          ? el('strong', { class: 'applies', text: 'apply to you' })
          : el('span', { class: 'muted', text: i === 0 ? '' : policy.group + ' comes first' })),
        el('td', { 'data-label': 'Quota', class: 'quota-cell', text: u ? quotaText(u) : (u === null ? 'not known' : '…') }));
    });
    box.replaceChildren(
      el('div', { class: 'table-scroll' }, el('table', { class: 'groups-table' },
        el('caption', { class: 'sr-only', text: 'My groups' }),
        el('thead', {}, el('tr', {}, ['Group', 'Role', 'From', 'Rules', 'Quota'].map((c) => el('th', { scope: 'col', text: c })))),
        el('tbody', {}, rows))),
      sentences());
  }

  // One sentence per model: what the user may book.
  function sentences() {
    return el('ul', { class: 'policy-list', id: 'mg-policy' },
      policy.models.map((m) => el('li', { 'data-model': m.model, class: m.allowed ? '' : 'not-allowed', text: m.sentence })));
  }

  async function load() {
    const mine = ++seq;
    let p;
    try {
      p = await call('GET', '/policy');
    } catch (e) {
      if (mine !== seq) return;
      const box = $('mg-body');
      if (box) box.replaceChildren(errorNote(e, 'Your rules could not be loaded'));
      return;
    }
    if (mine !== seq) return;
    policy = p;
    renderBook();
    renderMine();
    const next = new Map();
    await Promise.all(p.groups.map(async (g) => {
      try {
        next.set(g.name, await call('GET', '/groups/' + enc(g.name) + '/usage'));
      } catch (e) {
        next.set(g.name, null);
      }
    }));
    if (mine !== seq) return;
    usages = next;
    renderBook();
    renderMine();
  }

  document.addEventListener('change', (ev) => {
    if (ev.target && ev.target.id === 'book-model') renderBook();
  });

  window.gpuBookingPolicy = Object.freeze({
    shown(view) {
      if (view === 'book' || view === 'groups') load();
    },
    refresh: load,
    current: () => policy,
  });
})();
