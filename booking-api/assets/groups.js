// "Manage groups" on the Groups and courses view: admins create groups, set their
// order, rules (over the lab's), models, quotas and members, and delete them; a
// group's owners manage its members. Only the REST API is called
// (/api/v1/groups...); it decides who may do what and says why it refuses.
'use strict';

(function () {
  const { el, call } = window.gpuBookingDom;
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const DAY = 86400;
  const HOUR = 3600;

  // The policy settings a group may set, with the unit the form shows them in.
  const SETTINGS = [
    { key: 'max_duration_seconds', label: 'Longest booking (days)', scale: DAY },
    { key: 'min_duration_seconds', label: 'Shortest booking (hours)', scale: HOUR },
    { key: 'max_ahead_seconds', label: 'Book at most (days ahead)', scale: DAY },
    { key: 'cooldown_seconds', label: 'Waiting time between bookings (days)', scale: DAY },
    { key: 'max_planned', label: 'Planned bookings at once', scale: 1 },
    { key: 'max_units_per_booking', label: 'GPUs per booking', scale: 1 },
  ];

  let ctx = { admin: false, confirm: null };
  let models = [];
  let lab = null;
  let seq = 0;

  function problem(e, what) {
    return el('div', { class: 'notice error', 'data-code': e.code || '' },
      el('p', {}, el('strong', { text: what + '. ' })),
      el('p', { class: 'api-message' }, 'The booking service says: ', el('q', { text: e.message })));
  }

  function ok(text) {
    return el('div', { class: 'notice ok', text });
  }

  function shown(value, scale) {
    if (value === null || value === undefined) return '';
    return String(Math.round((value / scale) * 10000) / 10000);
  }

  // A field of the form as the API takes it: null (inherit) when empty.
  function read(input, scale) {
    const v = input.value.trim();
    if (v === '') return null;
    const n = Number(v);
    if (!Number.isFinite(n) || n < 0) throw new Error(input.labels[0].textContent + ': give a number, or leave it empty');
    return scale === 1 ? Math.round(n) : Math.round(n * scale);
  }

  function groupForm(g) {
    const key = g.name;
    const id = (f) => 'gm-' + key + '-' + f;
    const settings = SETTINGS.map((s) => el('div', {},
      el('label', { for: id(s.key), text: s.label }),
      el('input', {
        id: id(s.key), name: s.key, type: 'number', min: '0', step: 'any', inputmode: 'decimal',
        value: shown(g.policy[s.key], s.scale),
        placeholder: lab && lab[s.key] !== undefined ? 'lab: ' + shown(lab[s.key], s.scale) : '',
      })));
    const notAllowed = new Set(g.models.filter((m) => !m.allowed).map((m) => m.model));
    const modelBoxes = models.map((m) => el('label', { class: 'inline-check' },
      el('input', { type: 'checkbox', name: 'model-allowed', value: m.name, checked: g.listed_models_only ? g.models.some((x) => x.model === m.name && x.allowed) : !notAllowed.has(m.name) }),
      m.name));
    const q = g.quota || {};
    const form = el('form', { class: 'group-form', 'data-group': key, novalidate: true },
      el('div', { class: 'model-fields' },
        el('div', {}, el('label', { for: id('position'), text: 'Order' }),
          el('input', { id: id('position'), name: 'position', type: 'number', step: '1', value: g.position, inputmode: 'numeric' })),
        el('div', { class: 'wide' }, el('label', { for: id('description'), text: 'Description' }),
          el('input', { id: id('description'), name: 'description', type: 'text', maxlength: '1024', value: g.description || '', autocomplete: 'off' }))),
      el('fieldset', {}, el('legend', { text: 'Rules (empty: the lab\'s)' }), el('div', { class: 'model-fields' }, settings)),
      el('fieldset', {}, el('legend', { text: 'May book' }), modelBoxes),
      el('fieldset', {}, el('legend', { text: 'Quota (empty: no limit)' }),
        el('div', { class: 'model-fields' },
          el('div', {}, el('label', { for: id('gpu-hours'), text: 'GPU-hours per period' }),
            el('input', { id: id('gpu-hours'), name: 'gpu_hours', type: 'number', min: '0', step: '1', inputmode: 'numeric', value: q.gpu_hours === null || q.gpu_hours === undefined ? '' : q.gpu_hours })),
          el('div', {}, el('label', { for: id('period'), text: 'Period' }),
            el('select', { id: id('period'), name: 'period' },
              el('option', { value: 'month', text: 'calendar month', selected: q.period !== 'term' }),
              el('option', { value: 'term', text: 'the admin\'s terms', selected: q.period === 'term' }))),
          el('div', {}, el('label', { for: id('units'), text: 'Units held at once' }),
            el('input', { id: id('units'), name: 'units', type: 'number', min: '0', step: '1', inputmode: 'numeric', value: q.units === null || q.units === undefined ? '' : q.units })))),
      el('div', { class: 'actions' },
        el('button', { type: 'submit', text: 'Save ' + g.name }),
        el('button', { type: 'button', class: 'danger', onclick: () => remove(g) }, 'Delete group', el('span', { class: 'sr-only', text: ' ' + g.name }))),
      el('div', { class: 'result', 'aria-live': 'polite' }));
    form.addEventListener('submit', (ev) => save(ev, g));
    return form;
  }

  async function save(ev, g) {
    ev.preventDefault();
    const f = ev.currentTarget;
    const result = f.querySelector('.result');
    let body;
    try {
      const policy = {};
      for (const s of SETTINGS) policy[s.key] = read(f.elements[s.key], s.scale);
      const allowed = new Set([...f.querySelectorAll('input[name="model-allowed"]:checked')].map((c) => c.value));
      // Per-model settings stay; only whether each model may be booked changes.
      const byModel = new Map(g.models.map((m) => [m.model, m]));
      const modelsOut = [];
      for (const m of models) {
        const had = byModel.get(m.name);
        if (had || !allowed.has(m.name)) modelsOut.push({ model: m.name, allowed: allowed.has(m.name), policy: had ? had.policy : {} });
      }
      body = {
        position: Number(f.elements.position.value || '0'),
        description: f.elements.description.value.trim(),
        policy,
        listed_models_only: false,
        models: modelsOut,
        quota: {
          gpu_hours: read(f.elements.gpu_hours, 1),
          period: f.elements.period.value,
          units: read(f.elements.units, 1),
        },
      };
      if (!Number.isInteger(body.position)) throw new Error('Order: give a whole number');
    } catch (e) {
      result.replaceChildren(el('div', { class: 'notice error', text: e.message }));
      return;
    }
    try {
      const saved = await call('PUT', '/groups/' + enc(g.name), body);
      await load();
      const again = document.querySelector('.group-form[data-group="' + CSS.escape(saved.name) + '"] .result');
      if (again) again.replaceChildren(ok('Saved ' + saved.name + '.'));
      refreshOthers();
    } catch (e) {
      result.replaceChildren(problem(e, 'Not saved'));
    }
  }

  async function remove(g) {
    const yes = ctx.confirm
      ? await ctx.confirm('Delete group ' + g.name + '?', 'Its members, rules and quota go; its bookings stay and count against no group. Its course reservations stay until removed.', 'Delete group')
      : window.confirm('Delete group ' + g.name + '?');
    if (!yes) return;
    try {
      await call('DELETE', '/groups/' + enc(g.name));
      await load();
      $('gm-result-top').replaceChildren(ok('Deleted ' + g.name + '.'));
      refreshOthers();
    } catch (e) {
      $('gm-result-top').replaceChildren(problem(e, 'Not deleted'));
    }
  }

  function membersBlock(g, manage) {
    const rows = g.members.map((m) => el('tr', { 'data-user': m.user, 'data-role': m.role },
      el('td', { 'data-label': 'User', text: m.user }),
      el('td', { 'data-label': 'Role', text: m.role }),
      el('td', { 'data-label': 'From', text: m.source }),
      el('td', { 'data-label': 'Actions' }, manage && (ctx.admin || m.role !== 'owner')
        ? el('button', { type: 'button', class: 'secondary small', onclick: (ev) => removeMember(g, m, ev.currentTarget) },
          'Remove', el('span', { class: 'sr-only', text: ' ' + m.user + ' from ' + g.name }))
        : '')));
    const id = (f) => 'gm-' + g.name + '-member-' + f;
    const add = el('form', { class: 'filters member-form', novalidate: true },
      el('div', {}, el('label', { for: id('user'), text: 'Add a member (user name or e-mail)' }),
        el('input', { id: id('user'), name: 'user', type: 'text', autocomplete: 'off', required: true })),
      el('div', {}, el('label', { for: id('role'), text: 'Role' }),
        el('select', { id: id('role'), name: 'role' },
          el('option', { value: 'member', text: 'member' }),
          ctx.admin ? el('option', { value: 'owner', text: 'owner (manages members and courses)' }) : null)),
      el('button', { type: 'submit', text: 'Add to ' + g.name }),
      el('div', { class: 'result', 'aria-live': 'polite' }));
    add.addEventListener('submit', (ev) => addMember(ev, g));
    return el('div', { class: 'members', 'data-group': g.name },
      el('h5', { text: 'Members of ' + g.name }),
      rows.length
        ? el('div', { class: 'table-scroll' }, el('table', { class: 'members-table' },
          el('caption', { class: 'sr-only', text: 'Members of ' + g.name }),
          el('thead', {}, el('tr', {}, ['User', 'Role', 'From', ''].map((c) => el('th', { scope: 'col' }, c || el('span', { class: 'sr-only', text: 'Actions' }))))),
          el('tbody', {}, rows)))
        : el('p', { class: 'muted', text: 'No members yet.' }),
      manage ? add : null);
  }

  async function addMember(ev, g) {
    ev.preventDefault();
    const f = ev.currentTarget;
    const result = f.querySelector('.result');
    const user = f.elements.user.value.trim();
    if (!user) { result.replaceChildren(el('div', { class: 'notice error', text: 'Give the user\'s name.' })); f.elements.user.focus(); return; }
    try {
      const m = await call('PUT', '/groups/' + enc(g.name) + '/members/' + enc(user), { role: f.elements.role.value });
      await load();
      const again = document.querySelector('.members[data-group="' + CSS.escape(g.name) + '"] .member-form .result');
      if (again) again.replaceChildren(ok(m.user + ' is now ' + (m.role === 'owner' ? 'an owner' : 'a member') + ' of ' + g.name + '.'));
      refreshOthers();
    } catch (e) {
      result.replaceChildren(problem(e, 'Not added'));
    }
  }

  async function removeMember(g, m, button) {
    const yes = ctx.confirm
      ? await ctx.confirm('Remove ' + m.user + ' from ' + g.name + '?', 'Their bookings stay; new ones no longer count against ' + g.name + '. A token\'s or JupyterHub\'s groups may add them again while they still name the group.', 'Remove')
      : window.confirm('Remove ' + m.user + '?');
    if (!yes) { button.focus(); return; }
    try {
      await call('DELETE', '/groups/' + enc(g.name) + '/members/' + enc(m.user));
      await load();
      refreshOthers();
    } catch (e) {
      const box = document.querySelector('.members[data-group="' + CSS.escape(g.name) + '"] .member-form .result');
      if (box) box.replaceChildren(problem(e, 'Not removed'));
    }
  }

  function newGroupForm() {
    const form = el('form', { class: 'group-new filters', id: 'gm-new', novalidate: true },
      el('div', {}, el('label', { for: 'gm-new-name', text: 'New group\'s name' }),
        el('input', { id: 'gm-new-name', name: 'name', type: 'text', maxlength: '128', autocomplete: 'off', required: true, placeholder: 'e.g. ml-lab' })),
      el('div', {}, el('label', { for: 'gm-new-position', text: 'Order' }),
        el('input', { id: 'gm-new-position', name: 'position', type: 'number', step: '1', value: '0', inputmode: 'numeric' })),
      el('div', { class: 'wide' }, el('label', { for: 'gm-new-description', text: 'Description' }),
        el('input', { id: 'gm-new-description', name: 'description', type: 'text', maxlength: '1024', autocomplete: 'off' })),
      el('button', { type: 'submit', text: 'Create group' }),
      el('div', { class: 'result', 'aria-live': 'polite' }));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const result = form.querySelector('.result');
      const name = form.elements.name.value.trim();
      const position = Number(form.elements.position.value || '0');
      if (!name || !Number.isInteger(position)) {
        result.replaceChildren(el('div', { class: 'notice error', text: 'Give a name and a whole number for the order.' }));
        return;
      }
      try {
        const g = await call('POST', '/groups', { name, position, description: form.elements.description.value.trim() });
        await load();
        $('gm-result-top').replaceChildren(ok('Created ' + g.name + '.'));
        refreshOthers();
      } catch (e) {
        result.replaceChildren(problem(e, 'Not created'));
      }
    });
    return form;
  }

  // The caller's rules and the course form's groups follow the groups.
  function refreshOthers() {
    if (window.gpuBookingPolicy) window.gpuBookingPolicy.refresh();
    if (window.gpuBookingReservations) window.gpuBookingReservations.refresh();
  }

  async function load() {
    const mine = ++seq;
    const box = $('gm-list');
    let groups;
    let policy;
    try {
      [groups, models, policy] = await Promise.all([call('GET', '/groups'), call('GET', '/models'), call('GET', '/policy')]);
    } catch (e) {
      if (mine !== seq) return;
      $('manage-groups').hidden = false;
      box.replaceChildren(problem(e, 'The groups could not be loaded'));
      return;
    }
    if (mine !== seq) return;
    lab = policy.lab;
    const owned = new Set(policy.groups.filter((g) => g.role === 'owner').map((g) => g.name));
    $('manage-groups').hidden = !(ctx.admin || owned.size);
    $('gm-hint').hidden = !ctx.admin;
    const parts = [el('div', { id: 'gm-result-top', 'aria-live': 'polite' })];
    for (const g of groups) {
      const manage = ctx.admin || owned.has(g.name);
      if (!manage) continue;
      parts.push(el('section', { class: 'group-card', 'data-group': g.name, 'aria-labelledby': 'gm-h-' + g.name },
        el('h4', { id: 'gm-h-' + g.name }, g.name, el('span', { class: 'muted', text: ' order ' + g.position + (g.description ? ' · ' + g.description : '') })),
        ctx.admin ? groupForm(g) : null,
        membersBlock(g, manage)));
    }
    if (ctx.admin) parts.push(el('h4', { text: 'Add a group' }), newGroupForm());
    box.replaceChildren(...parts);
  }

  window.gpuBookingGroups = Object.freeze({
    shown(view, c) {
      ctx = c;
      if (view === 'groups') load();
    },
    refresh: load,
  });
})();
