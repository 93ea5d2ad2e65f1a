// What keeps a volume's data safe, beyond its snapshots: its copies (on a
// cluster, with a resync's progress), its backups in each backup target,
// and its DR relationship (the policy and, for an admin, the scheduler's
// status).
import { useEffect, useState } from 'preact/hooks';
import { api, APIError } from './api.js';
import { byTime, bytes, time } from './format.js';
import { html, Meter } from './ui.js';

// Copies lists the volume's copies; a volume on a single node has one.
export function Copies({ vol }) {
  const copies = vol.copies || [];
  if (copies.length === 0)
    return html`<p data-copies="1">One copy${vol.primary ? ` on ${vol.primary}` : ', on this node'}.</p>`;
  return html`<table class="grid" data-table="copies" data-copies=${copies.length}>
    <thead><tr><th>Node</th><th>State</th><th>Resync</th></tr></thead>
    <tbody>
      ${copies.map(
        (c) => html`<tr data-copy=${c.node} data-state=${c.state}>
          <td>${c.node}${c.node === vol.primary ? ' (primary)' : ''}</td>
          <td class=${c.state === 'in-sync' ? 'ok' : c.state === 'failed' || c.state === 'degraded' ? 'bad' : 'warn'}>
            ${c.state || 'being made'}${c.reason ? ': ' + c.reason : ''}
          </td>
          <td>
            ${c.progress != null &&
            html`<div class="progress" data-progress=${c.progress}>
              <${Meter} used=${c.doneBytes} total=${c.totalBytes} />
              <span>${c.progress.toFixed(1)}% (${bytes(c.doneBytes)} of ${bytes(c.totalBytes)})</span>
            </div>`}
          </td>
        </tr>`,
      )}
    </tbody>
  </table>`;
}

// Backups lists the volume's backups in every target the server has,
// newest first, and its backup policy.
export function Backups({ vol }) {
  const [state, setState] = useState(null); // {items} or {none: message}
  useEffect(() => {
    let stopped = false;
    (async () => {
      try {
        const targets = (await api.backupTargets()).items || [];
        if (targets.length === 0) throw new APIError(404, 'NotFound', 'no backup target');
        const lists = await Promise.all(targets.map((t) => api.backups(t.name, vol.name)));
        const items = lists.flatMap((l) => l.items || []);
        items.sort((a, b) => byTime(b.createdAt, a.createdAt));
        if (!stopped) setState({ items });
      } catch (e) {
        // NotFound: the server has no backup target (docs/backup.md).
        if (!stopped) setState({ none: e.code === 'NotFound' ? 'No backup target on this server.' : `${e.code}: ${e.message}` });
      }
    })();
    return () => {
      stopped = true;
    };
  }, [vol.name]);
  const p = vol.backupPolicy;
  return html`<div data-backups>
    ${p &&
    html`<p data-backup-policy>
      Every ${p.every}${p.target ? ` to ${p.target}` : ''}${p.keepLast ? `, keeping the last ${p.keepLast}` : ''}.
    </p>`}
    ${!state
      ? html`<p class="loading">Loading…</p>`
      : state.none
        ? html`<p class="dim">${state.none}</p>`
        : state.items.length === 0
          ? html`<p class="dim">No backups.</p>`
          : html`<table class="grid" data-table="backups">
              <thead><tr><th>ID</th><th>Target</th><th>Snapshot</th><th>Taken</th><th>Kind</th><th>Size</th><th>Stored</th></tr></thead>
              <tbody>
                ${state.items.map(
                  (b) => html`<tr data-backup=${b.id}>
                    <td>${b.id}</td><td>${b.target}</td><td>${b.snapshot}</td><td>${time(b.createdAt)}</td>
                    <td>${b.parent ? 'incremental' : 'full'}</td>
                    <td>${bytes(b.stats.logical)}</td><td>${bytes(b.stats.bytesSent)}</td>
                  </tr>`,
                )}
              </tbody>
            </table>`}
  </div>`;
}

// DR shows the volume's DR policy and, for a token that may read it (an
// admin's), the scheduler's status of its relationship.
export function DR({ vol }) {
  const [rows, setRows] = useState(null);
  useEffect(() => {
    let stopped = false;
    if (!vol.drPolicy) return;
    api.drStatus().then(
      (l) => !stopped && setRows((l.items || []).filter((s) => s.volume === vol.name)),
      () => !stopped && setRows([]),
    );
    return () => {
      stopped = true;
    };
  }, [vol.name, vol.drPolicy && vol.drPolicy.relationship]);
  const p = vol.drPolicy;
  if (!p) return html`<p class="dim" data-dr="none">No DR relationship.</p>`;
  return html`<div data-dr=${p.site + '/' + p.relationship}>
    <p>To site <strong>${p.site}</strong>, relationship <strong>${p.relationship}</strong>, RPO ${p.rpo}.</p>
    ${rows &&
    rows.length > 0 &&
    html`<table class="grid" data-table="dr">
      <thead><tr><th>Site</th><th>Last point</th><th>Taken</th><th>Lag</th><th>Cycles</th><th>Failures</th><th>Last error</th></tr></thead>
      <tbody>
        ${rows.map(
          (s) => html`<tr data-dr-status=${s.site + '/' + s.relationship} data-last-point=${s.lastPoint || ''}>
            <td>${s.site}</td>
            <td>${s.lastPoint || '—'}</td>
            <td>${time(s.lastPointAt)}</td>
            <td class=${s.missed ? 'bad' : 'ok'}>${(s.lagNs / 1e9).toFixed(1)} s${s.missed ? ' (RPO missed)' : ''}</td>
            <td>${s.cycles}</td>
            <td>${s.failures}</td>
            <td class="bad">${s.lastError || ''}</td>
          </tr>`,
        )}
      </tbody>
    </table>`}
  </div>`;
}
