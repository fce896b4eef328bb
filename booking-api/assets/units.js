// Multi-GPU bookings on the booking page: when the policy lets a booking be for
// more than one GPU (GET /api/v1/policy, max_units_per_booking > 1), the booking
// form gets a "GPUs" field; app.js asks value() for the create's `units`. With the
// default policy (one GPU per booking) nothing shows and nothing is sent.
'use strict';

(function () {
  const API = '/api/v1';
  const TOKEN_KEY = 'gpu-booking-token'; // app.js keeps the signed-in token there
  let max = 1;
  let asked = null;

  function field() {
    return document.getElementById('book-units');
  }

  // Inserted before the earliest-start line of the booking form, once.
  function ensureField() {
    if (field() || max <= 1) return;
    const before = document.getElementById('book-earliest');
    if (!before) return;
    const label = document.createElement('label');
    label.setAttribute('for', 'book-units');
    label.textContent = 'GPUs (1 to ' + max + ')';
    const input = document.createElement('input');
    Object.assign(input, { id: 'book-units', type: 'number', min: '1', max: String(max), step: '1', value: '1' });
    input.setAttribute('inputmode', 'numeric');
    input.setAttribute('aria-describedby', 'book-units-hint');
    const hint = document.createElement('p');
    hint.id = 'book-units-hint';
    hint.className = 'hint';
    hint.textContent = 'Your notebooks get high priority for this many GPUs at once; more run as lent GPUs, which can be taken back.';
    before.before(label, input, hint);
  }

  async function load() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token || asked === token) return;
    asked = token;
    try {
      const res = await fetch(API + '/policy', { headers: { Accept: 'application/json', Authorization: 'Bearer ' + token } });
      if (!res.ok) { asked = null; return; }
      const policy = await res.json();
      max = Number(policy.max_units_per_booking) || 1;
      ensureField();
    } catch (e) {
      asked = null; // asked again on the next view change
    }
  }

  window.gpuBookingUnits = {
    // The GPUs to book; undefined when the field is not shown (the API's default: 1).
    value() {
      const input = field();
      if (!input) return undefined;
      const n = Number(input.value);
      return Number.isInteger(n) && n >= 1 ? n : input.value;
    },
  };

  window.addEventListener('hashchange', load);
  document.addEventListener('DOMContentLoaded', () => { load(); window.setTimeout(load, 1000); });
  document.addEventListener('submit', load, true);
})();
