// The audit log (GET /v1/events): the last day's events, newest first,
// and those that follow, read every two seconds while the page is open. A
// tenant's token reads its tenant's events only (the server's filter).
import { useEffect, useState } from 'preact/hooks';
import { api } from './api.js';
import { time } from './format.js';
import { html, ErrorBox } from './ui.js';

const shown = 500; // rows in the page, newest first

export function Events() {
  const [events, setEvents] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => {
    let stopped = false;
    let last = 0;
    const since = new Date(Date.now() - 24 * 3600 * 1000);
    const load = async () => {
      try {
        const l = await api.events(last, since);
        if (stopped) return;
        const items = l.items || [];
        if (items.length) last = items[items.length - 1].seq;
        setEvents((old) => [...items.reverse(), ...(old || [])].slice(0, shown));
        setError(null);
      } catch (e) {
        if (!stopped) setError(e);
      }
    };
    load();
    const id = setInterval(load, 2000);
    return () => {
      stopped = true;
      clearInterval(id);
    };
  }, []);

  if (!events) return error ? html`<${ErrorBox} error=${error} />` : html`<p class="loading">Loading…</p>`;
  return html`<section>
    <div class="toolbar"><h2>Audit log</h2><span class="count">the last day's changes and refusals, newest first</span></div>
    <${ErrorBox} error=${error} />
    ${events.length === 0
      ? html`<p class="dim">No events.</p>`
      : html`<table class="grid events" data-table="events">
          <thead><tr><th>#</th><th>Time</th><th>Who</th><th>Request</th><th>Names</th><th>Answer</th></tr></thead>
          <tbody>
            ${events.map(
              (e) => html`<tr data-event=${e.seq} data-route=${e.route || ''} data-status=${e.status} data-tenant=${e.who.tenant || ''}>
                <td>${e.seq}</td>
                <td>${time(e.time)}</td>
                <td>${[e.who.role, e.who.tenant, e.who.tokenId, e.who.cert, e.who.remote].filter(Boolean).join(' · ')}</td>
                <td>${e.route || e.method}</td>
                <td>${Object.entries(e.names || {}).map(([k, v]) => `${k}=${v}`).join(' ')}</td>
                <td class=${e.status >= 400 ? 'bad' : 'ok'}>${e.status}${e.code ? ' ' + e.code : ''}</td>
              </tr>`,
            )}
          </tbody>
        </table>`}
  </section>`;
}
