// Jobs: every job the token sees (GET /v1/jobs), read again every second
// while the page is open, with each one's progress; a running job can be
// cancelled (DELETE /v1/jobs/{id}) by a token that may write.
import { useEffect, useState } from 'preact/hooks';
import { api } from './api.js';
import { byTime, bytes, time } from './format.js';
import { html, Action, ErrorBox, Meter } from './ui.js';

export function Jobs({ canWrite }) {
  const [jobs, setJobs] = useState(null);
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState('');
  useEffect(() => {
    let stopped = false;
    const load = () =>
      api.jobs().then(
        (l) => !stopped && (setJobs(l.items || []), setError(null)),
        (e) => !stopped && setError(e),
      );
    load();
    const id = setInterval(load, 1000);
    return () => {
      stopped = true;
      clearInterval(id);
    };
  }, []);

  if (!jobs) return error ? html`<${ErrorBox} error=${error} />` : html`<p class="loading">Loading…</p>`;
  const sorted = [...jobs].sort((a, b) => byTime(b.startedAt, a.startedAt));
  return html`<section class="jobs">
    <div class="toolbar"><h2>Jobs</h2><span class="count">${jobs.length} job(s), finished ones kept 10 minutes</span></div>
    <${ErrorBox} error=${error} />
    ${notice && html`<div class="notice" role="status">${notice}</div>`}
    ${sorted.length === 0
      ? html`<p class="dim">No jobs.</p>`
      : html`<table class="grid" data-table="jobs">
          <thead><tr><th>Kind</th><th>Target</th><th>State</th><th>Progress</th><th>Started</th><th>Ended</th>${canWrite && html`<th></th>`}</tr></thead>
          <tbody>
            ${sorted.map((j) => {
              const items = j.itemsTotal > 0;
              const done = items ? j.itemsDone : j.bytesDone;
              const total = items ? j.itemsTotal : j.bytesTotal;
              return html`<tr data-job=${j.id} data-state=${j.state} data-done=${done} data-total=${total}>
                <td>${j.kind}</td>
                <td>${j.target}</td>
                <td class=${j.state === 'failed' ? 'bad' : j.state === 'done' ? 'ok' : ''}>
                  ${j.state}${j.error ? html`: <span class="bad">${j.error.code}: ${j.error.message}</span>` : ''}
                </td>
                <td>
                  <div class="progress">
                    <${Meter} used=${done} total=${total} />
                    <span>${items ? `${done}/${total}` : total > 0 ? `${bytes(done)} of ${bytes(total)}` : ''}</span>
                  </div>
                </td>
                <td>${time(j.startedAt)}</td>
                <td>${time(j.endedAt)}</td>
                ${canWrite &&
                html`<td class="actions">
                  ${j.state === 'running' &&
                  html`<${Action}
                    id=${'cancel-job-' + j.id}
                    danger
                    label="Cancel job"
                    title=${`Cancel ${j.kind} ${j.target}`}
                    confirm="The job stops and undoes its partial work; it ends as cancelled."
                    run=${() => api.cancelJob(j.id)}
                    done=${() => setNotice(`Cancelling job ${j.id}.`)}
                  />`}
                </td>`}
              </tr>`;
            })}
          </tbody>
        </table>`}
  </section>`;
}
