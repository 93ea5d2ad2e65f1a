// Shared pieces: htm bound to Preact, the dialog that confirms an action
// and shows the server's error, and small display components.
import { h } from 'preact';
import { useState } from 'preact/hooks';
import htm from 'htm';

export const html = htm.bind(h);

// ErrorBox shows an APIError as the server sent it: its code and message.
export function ErrorBox({ error }) {
  if (!error) return null;
  return html`<div class="error" role="alert">
    ${error.code ? html`<strong>${error.code}</strong>: ` : ''}${error.message}
  </div>`;
}

// Action is a button that opens a dialog: the fields to fill (if any), a
// confirmation, and the server's answer. run(values) performs the action
// through the API; done(result) follows a success.
export function Action({ label, title, danger, fields = [], confirm, run, done, id }) {
  const [open, setOpen] = useState(false);
  const [values, setValues] = useState({});
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);

  const start = () => {
    const v = {};
    for (const f of fields) v[f.name] = f.initial ?? (f.type === 'checkbox' ? false : '');
    setValues(v);
    setError(null);
    setOpen(true);
  };
  const submit = async (e) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const res = await run(values);
      setOpen(false);
      done && done(res, values);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`
    <button class=${danger ? 'danger' : ''} data-action=${id} onClick=${start}>${label}</button>
    ${open &&
    html`<div class="backdrop">
      <form class="dialog" role="dialog" aria-label=${title} data-dialog=${id} onSubmit=${submit}>
        <h3>${title}</h3>
        ${fields.map(
          (f) => html`<label>
            ${f.label}
            ${f.type === 'checkbox'
              ? html`<input
                  type="checkbox"
                  name=${f.name}
                  checked=${values[f.name]}
                  onChange=${(e) => setValues({ ...values, [f.name]: e.target.checked })}
                />`
              : f.options
                ? html`<select
                    name=${f.name}
                    value=${values[f.name]}
                    onChange=${(e) => setValues({ ...values, [f.name]: e.target.value })}
                  >
                    ${f.options.map((o) => html`<option value=${o}>${o}</option>`)}
                  </select>`
                : html`<input
                    name=${f.name}
                    placeholder=${f.placeholder || ''}
                    value=${values[f.name]}
                    onInput=${(e) => setValues({ ...values, [f.name]: e.target.value })}
                  />`}
          </label>`,
        )}
        ${confirm && html`<p class="confirm">${typeof confirm === 'function' ? confirm(values) : confirm}</p>`}
        <${ErrorBox} error=${error} />
        <div class="buttons">
          <button type="button" onClick=${() => setOpen(false)}>Cancel</button>
          <button type="submit" class=${danger ? 'danger' : 'primary'} name="confirm" disabled=${busy}>
            ${busy ? 'Working…' : label}
          </button>
        </div>
      </form>
    </div>`}
  `;
}

// Meter draws used against total as a bar.
export function Meter({ used, total }) {
  const pct = total > 0 ? Math.min(100, (100 * used) / total) : 0;
  return html`<div class="meter" title=${pct.toFixed(1) + '%'}>
    <div style=${{ width: pct + '%' }}></div>
  </div>`;
}
