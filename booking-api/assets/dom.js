// The page's one DOM helper, shared by every part of the page (loaded first; each
// part's script takes `el` from window.gpuBookingDom), with the API call and the
// lab's time zone that the later parts share.
'use strict';

window.gpuBookingDom = Object.freeze({
  // An element with attributes and children. Attributes: `class`, `text` (its text),
  // `on<event>` (a listener), `true` as a present boolean attribute; null, undefined
  // and false leave the attribute out. Children: nodes or text; null, undefined,
  // false and '' are skipped. Text always goes in as text, never as HTML.
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = v;
      else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
      else if (v === true) node.setAttribute(k, '');
      else node.setAttribute(k, v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false || c === '') continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  },

  // A call of the REST API with the token app.js keeps for this tab (none behind a
  // sign-in proxy): the JSON answer, or an Error with the API's `message` (its
  // words for the user), `code` (`error`), `status` and the whole answer (`body`).
  async call(method, path, body) {
    const headers = { Accept: 'application/json' };
    const token = sessionStorage.getItem('gpu-booking-token');
    if (token) headers.Authorization = 'Bearer ' + token;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res;
    try {
      res = await fetch('/api/v1' + path, {
        method, headers, credentials: 'same-origin',
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw Object.assign(new Error('The booking service cannot be reached.'), { code: 'network', status: 0, body: null });
    }
    const data = res.status === 204 ? null : await res.json().catch(() => null);
    if (!res.ok) {
      const message = (data && data.message) || ('HTTP ' + res.status);
      throw Object.assign(new Error(message), { code: (data && data.error) || 'http_' + res.status, status: res.status, body: data });
    }
    return data;
  },

  // The lab's time zone (IANA name) as the server fills it in; null where it does not.
  labZone() {
    const m = document.querySelector('meta[name="gpu-booking-time-zone"]');
    const zone = m ? m.getAttribute('content').trim() : '';
    if (!zone) return null;
    try {
      new Intl.DateTimeFormat('en', { timeZone: zone });
      return zone;
    } catch (e) {
      return null;
    }
  },
});
