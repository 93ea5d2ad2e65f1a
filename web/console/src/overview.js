// Overview: the pool's capacity and overcommit, the nodes (for a token
// that may list them), health and the running jobs.
import { useEffect, useState } from 'preact/hooks';
import { api } from './api.js';
import { bytes } from './format.js';
import { html, ErrorBox, Meter } from './ui.js';

export function Overview() {
  const [pool, setPool] = useState(null);
  const [nodes, setNodes] = useState(null);
  const [ready, setReady] = useState(null);
  const [version, setVersion] = useState(null);
  const [jobs, setJobs] = useState(null);
  const [error, setError] = useState(null);

  useEffect(() => {
    api.pool().then(setPool, setError);
    api.nodes().then((l) => setNodes(l.items), (e) => setNodes(e));
    api.ready().then(setReady, () => setReady(false));
    api.version().then(setVersion, () => {});
    api.jobs().then((l) => setJobs(l.items), () => setJobs([]));
  }, []);

  if (error) return html`<${ErrorBox} error=${error} />`;
  if (!pool) return html`<p class="loading">Loading…</p>`;
  const used = pool.totalBytes - pool.freeBytes;
  const over = pool.totalBytes > 0 ? pool.provisionedBytes / pool.totalBytes : 0;
  const running = (jobs || []).filter((j) => j.state === 'running');
  return html`<section class="overview">
    <h2>Overview</h2>
    <div class="cards">
      <div class="card" data-card="health">
        <h3>Health</h3>
        <p class=${ready ? 'ok' : 'bad'}>${ready === null ? '…' : ready ? 'Ready' : 'Not ready'}</p>
        ${pool.readOnly && html`<p class="bad">Pool is read-only</p>`}
        ${pool.broken > 0 && html`<p class="bad">${pool.broken} volume(s) quarantined</p>`}
        ${version && html`<p class="dim">quiver ${version.version}</p>`}
      </div>
      <div class="card" data-card="capacity">
        <h3>Capacity</h3>
        <${Meter} used=${used} total=${pool.totalBytes} />
        <p>${bytes(used)} used of ${bytes(pool.totalBytes)} (${bytes(pool.freeBytes)} free)</p>
        <p>
          ${bytes(pool.provisionedBytes) + ' provisioned: '}
          <span class=${over > 1 ? 'warn' : ''}>${over.toFixed(2)}× overcommit</span>
        </p>
        <p>${pool.filesystem} at ${pool.path}</p>
      </div>
      <div class="card" data-card="volumes">
        <h3>Volumes</h3>
        <p class="big"><a href="#/volumes">${pool.volumes}</a></p>
        ${pool.tenant && html`<p>tenant ${pool.tenant.name}</p>`}
        <p>${running.length} job(s) running</p>
      </div>
    </div>
    ${pool.clusterPool &&
    html`<p>
      Cluster ${pool.cluster}: ${bytes(pool.clusterPool.totalBytes - pool.clusterPool.freeBytes)} used of
      ${bytes(pool.clusterPool.totalBytes)}, ${pool.clusterPool.volumes} volumes
    </p>`}
    <h3>Nodes</h3>
    ${nodes === null
      ? html`<p class="loading">Loading…</p>`
      : nodes instanceof Error
        ? html`<p class="dim" data-nodes="hidden">Not visible to this token (${nodes.code}).</p>`
        : html`<table class="grid">
            <thead>
              <tr><th>Name</th><th>State</th><th>Address</th><th>Capacity</th><th>Free</th><th>Volumes</th></tr>
            </thead>
            <tbody>
              ${nodes.map(
                (n) => html`<tr data-node=${n.name}>
                  <td>${n.name}${n.self ? ' (this node)' : ''}</td>
                  <td class=${n.state === 'up' || n.state === 'local' ? 'ok' : 'bad'}>
                    ${n.state}${n.drain ? ', ' + n.drain : ''}
                  </td>
                  <td>${n.address}</td>
                  <td>${bytes(n.capacityBytes)}</td>
                  <td>${bytes(n.freeBytes)}</td>
                  <td>${n.volumes}</td>
                </tr>`,
              )}
            </tbody>
          </table>`}
  </section>`;
}
