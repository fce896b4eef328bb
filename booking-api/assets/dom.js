// The page's one DOM helper, shared by every part of the page (loaded first; each
// part's script takes `el` from window.gpuBookingDom).
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
});
