// The demo's cluster view: the simulated lab's GPU nodes, who holds each unit, what
// waits and why, and a button that spawns a notebook as JupyterHub would. It reads
// and writes only the demo's /demo/* routes; outside the demo they do not exist and
// the Cluster tab stays hidden. app.js calls shown() when the view changes.
'use strict';

(function () {
  const POLL_MS = 1000;
  let timer = null;
  let wired = false;

  const $ = (id) => document.getElementById(id);

  const { el } = window.gpuBookingDom;

  function fmtTime(t) {
    return new Date(t).toLocaleString(undefined, {
      day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short',
    });
  }

  async function call(method, path, body) {
    const res = await fetch(path, {
      method,
      headers: body ? { 'Content-Type': 'application/json' } : {},
      body: body ? JSON.stringify(body) : undefined,
      credentials: 'omit',
    });
    const data = res.status === 204 ? null : await res.json().catch(() => null);
    if (!res.ok) {
      const e = new Error((data && data.message) || ('HTTP ' + res.status));
      e.status = res.status;
      throw e;
    }
    return data;
  }

  // Seconds left until `t`, as a countdown (the view is polled every second).
  function countdown(t) {
    const s = Math.max(0, Math.round((new Date(t).getTime() - Date.now()) / 1000));
    if (s < 60) return s + ' s';
    return Math.floor(s / 60) + ' min ' + String(s % 60).padStart(2, '0') + ' s';
  }

  const offerWhat = (o) => (o.units > 1 ? o.units + ' ' + o.model + ' GPUs' : 'One ' + o.model + ' GPU');

  // What a pod is, in words: booked until when, or lent, and whose.
  function describe(p) {
    const who = p.user || 'no user';
    const parts = [];
    if (p.kind === 'booked') parts.push('booked by ' + who + (p.until ? ' until ' + fmtTime(p.until) : ''));
    else if (p.kind === 'lent' && p.taken_back_at) {
      parts.push('lent to ' + who + ', being taken back for a booked user in ' + countdown(p.taken_back_at)
        + ' (at ' + fmtTime(p.taken_back_at) + ')');
    } else if (p.kind === 'lent') parts.push('lent to ' + who + ' (taken back when a booked user needs it)');
    else parts.push(who);
    if (p.gpus === 0 && p.gpu_wanted && !p.offer) parts.push('waits for a GPU (' + p.gpu_wanted + ')');
    if (p.gpus > 0 && p.last_gpu_activity) parts.push('GPU last active ' + fmtTime(p.last_gpu_activity));
    if (p.terminating) parts.push('ending');
    else if (p.phase !== 'Running') parts.push(p.phase.toLowerCase());
    return parts.join(', ');
  }

  function stopButton(p) {
    if (!p.user || p.terminating) return null;
    return el('button', {
      type: 'button', class: 'secondary small', 'data-stop': p.user,
      'aria-label': 'Stop the notebook of ' + p.user,
      onclick: () => stop(p.user),
    }, 'Stop');
  }

  // A GPU offered back to the pod's user: held for them until they restart.
  function offerLine(o) {
    return el('div', { class: 'cl-offer' },
      el('strong', { text: offerWhat(o) + ' is held for ' + o.user + ': restart the server to get it' }),
      ' (for ' + countdown(o.until) + ', until ' + fmtTime(o.until) + ')');
  }

  function podLine(p) {
    return el('li', { class: 'cl-pod' + (p.taken_back_at ? ' cl-taken-back' : ''), 'data-pod': p.name },
      el('strong', { text: p.name }), ' ', describe(p),
      p.why ? el('div', { class: 'hint', text: p.why }) : null,
      p.offer ? offerLine(p.offer) : null,
      stopButton(p));
  }

  function renderNodes(nodes) {
    const box = $('cl-nodes');
    box.replaceChildren(...nodes.map((n) => {
      const byName = new Map(n.pods.map((p) => [p.name, p]));
      const free = n.units.filter((u) => !u).length;
      const units = n.units.map((holder, i) => {
        const p = holder && byName.get(holder);
        const kind = p ? p.kind : 'free';
        return el('li', { class: 'cl-unit cl-' + kind + (p && p.terminating ? ' cl-ending' : ''), 'data-unit': n.name + '/' + i },
          el('span', { class: 'cl-unit-label', text: 'GPU ' + i + ': ' + (p ? kind : 'free') }),
          p ? el('span', { class: 'cl-unit-who', text: describe(p) }) : null);
      });
      return el('section', { class: 'card cl-node', 'data-node': n.name, 'aria-label': 'Node ' + n.name },
        el('h3', {}, n.name, ' ', el('span', { class: 'muted', text: (n.model ? 'model ' + n.model + ', ' : '') + n.product })),
        el('p', { class: 'hint', text: free + ' of ' + n.units.length + ' GPUs free' }),
        el('ul', { class: 'cl-units' }, units),
        n.pods.length ? el('ul', { class: 'cl-pods' }, n.pods.map(podLine)) : null);
    }));
  }

  function renderList(id, pods, empty) {
    const box = $(id);
    if (!pods.length) { box.replaceChildren(el('p', { class: 'muted', text: empty })); return; }
    box.replaceChildren(el('ul', { class: 'cl-pods' }, pods.map(podLine)));
  }

  async function refresh() {
    try {
      const view = await call('GET', '/demo/cluster');
      renderNodes(view.nodes);
      renderList('cl-pending', view.pending, 'Nothing is waiting.');
      renderList('cl-cpu', view.cpu, 'No notebook runs on CPU.');
    } catch (e) {
      $('cl-result').textContent = 'The simulated cluster does not answer: ' + e.message;
    }
  }

  async function spawn(ev) {
    ev.preventDefault();
    const user = $('cl-user').value.trim();
    const out = $('cl-result');
    if (!user) { out.textContent = 'Name the user whose notebook to spawn.'; $('cl-user').focus(); return; }
    try {
      const r = await call('POST', '/demo/notebooks', { user, gpus: Number($('cl-gpus').value) });
      const lines = ['Spawned ' + r.pod.name + ': ' + describe(r.pod) + '.'];
      for (const w of r.warnings || []) lines.push('Warning: ' + w);
      out.replaceChildren(...lines.map((l) => el('p', { text: l })));
    } catch (e) {
      out.textContent = 'The cluster refused the notebook: ' + e.message;
    }
    await refresh();
  }

  async function stop(user) {
    try {
      await call('DELETE', '/demo/notebooks/' + encodeURIComponent(user));
      $('cl-result').textContent = 'Stopping the notebook of ' + user + '.';
    } catch (e) {
      $('cl-result').textContent = 'Could not stop the notebook of ' + user + ': ' + e.message;
    }
    await refresh();
  }

  window.gpuBookingCluster = {
    shown(visible, user) {
      if (!wired) {
        wired = true;
        $('cl-spawn').addEventListener('submit', spawn);
      }
      if (visible && user && !$('cl-user').value) $('cl-user').value = user;
      if (visible && !timer) { refresh(); timer = window.setInterval(refresh, POLL_MS); }
      if (!visible && timer) { window.clearInterval(timer); timer = null; }
    },
  };

  // Only the demo serves /demo/cluster: show the tab there.
  call('GET', '/demo/cluster').then(() => { $('tab-cluster').hidden = false; }, () => {});
})();
