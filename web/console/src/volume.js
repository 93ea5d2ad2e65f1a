// One volume (VM): its disks, snapshots and lineage, its attachments (the
// writer and fenced sides) and copies (a resync's progress), both read
// again every two seconds, its backups and DR, and the actions on them.
import { useEffect, useState } from 'preact/hooks';
import { api, APIError } from './api.js';
import { bytes, labels, parseSize, time } from './format.js';
import { html, Action, ErrorBox } from './ui.js';
import { IOChart } from './chart.js';
import { Lineage } from './lineage.js';
import { Backups, Copies, DR } from './protection.js';

// The QoS limits of the API (api.QoS), as the dialog's fields.
const qosFields = [
  ['rwIOPS', 'IOPS, reads and writes'],
  ['rwMBytes', 'MB/s, reads and writes'],
  ['readIOPS', 'Read IOPS'],
  ['writeIOPS', 'Write IOPS'],
  ['readMBytes', 'Read MB/s'],
  ['writeMBytes', 'Write MB/s'],
];

export function Volume({ name, canWrite }) {
  const [vol, setVol] = useState(null);
  const [snaps, setSnaps] = useState([]);
  const [atts, setAtts] = useState([]);
  const [vols, setVols] = useState(null);
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState('');

  const load = () => {
    api.volume(name).then(setVol, setError);
    api.snapshots(name).then((l) => setSnaps(l.items || []), () => setSnaps([]));
    api.attachments(name).then((l) => setAtts(l.items || []), () => setAtts([]));
    api.volumes().then((l) => setVols(l.items || []), () => setVols([]));
  };
  useEffect(load, [name]);
  // Attachments change under a live migration, copies under a resync:
  // read them again.
  useEffect(() => {
    let stopped = false;
    const id = setInterval(() => {
      api.attachments(name).then((l) => !stopped && setAtts(l.items || []), () => {});
      api.volume(name).then((v) => !stopped && setVol(v), () => {});
    }, 2000);
    return () => {
      stopped = true;
      clearInterval(id);
    };
  }, [name]);
  const after = (msg) => () => {
    setNotice(msg);
    load();
  };

  if (error) return html`<p><a href="#/volumes">← Volumes</a></p><${ErrorBox} error=${error} />`;
  if (!vol) return html`<p class="loading">Loading…</p>`;
  if (vol.state === 'broken')
    return html`<section><h2>${vol.name}</h2><div class="error" role="alert">Quarantined: ${vol.reason}</div></section>`;

  const writer = atts.find((a) => a.writer);
  const fenced = atts.filter((a) => a.fenced);
  return html`<section class="volume" data-volume-page=${vol.name}>
    <p><a href="#/volumes">← Volumes</a></p>
    <div class="toolbar">
      <h2>${vol.name}</h2>
      ${canWrite &&
      html`<div class="actions">
        <${Action}
          id="snapshot"
          label="Snapshot"
          title=${'Snapshot every disk of ' + vol.name}
          fields=${[{ name: 'name', label: 'Snapshot name', placeholder: 'nightly' }]}
          confirm="One crash-consistent snapshot of all the volume's disks at one instant."
          run=${(v) => api.createSnapshot(vol.name, v.name.trim())}
          done=${(s) => after(`Snapshot ${s.name} taken.`)()}
        />
        <${Action}
          id="clone"
          label="Clone"
          title=${'Clone ' + vol.name + ' (live)'}
          fields=${[{ name: 'names', label: 'New volume name(s), comma-separated', placeholder: 'web02' }]}
          confirm="Clones the live volume through an implicit snapshot."
          run=${(v) => api.clone({ volume: vol.name }, splitNames(v.names))}
          done=${(l) => after(`Cloned to ${l.items.map((x) => x.name).join(', ')}.`)()}
        />
        <${Action}
          id="qos"
          label="QoS"
          title=${'QoS limits of ' + vol.name}
          fields=${qosFields.map(([n, l]) => ({ name: n, label: l, placeholder: 'unlimited', initial: String((vol.qos || {})[n] || '') }))}
          confirm="One budget for all the volume's disks; an empty field is unlimited. Applies at once to the running VM."
          run=${(v) => api.updateVolume(vol.name, { qos: parseQoS(v) })}
          done=${after('QoS limits changed.')}
        />
        <${Action}
          id="labels"
          label="Labels"
          title=${'Labels of ' + vol.name}
          fields=${[{ name: 'labels', label: 'Labels (key=value, comma-separated)', initial: labels(vol.labels) }]}
          confirm="Replaces all the volume's labels."
          run=${(v) => api.updateVolume(vol.name, { labels: parseLabels(v.labels) })}
          done=${after('Labels changed.')}
        />
        <${Action}
          id="add-disk"
          label="Add disk"
          title=${'Add a disk to ' + vol.name}
          fields=${[
            { name: 'name', label: 'Disk name', placeholder: 'data2' },
            { name: 'size', label: 'Size (GiB, or 512M, 2T)', initial: '1' },
            { name: 'shared', label: 'Shared (several writers at once)', type: 'checkbox' },
          ]}
          run=${(v) => api.addDisk(vol.name, { name: v.name.trim(), size: parseSize(v.size), shared: v.shared })}
          done=${(_, v) => after(`Disk ${v.name.trim()} added.`)()}
        />
        <${Action}
          id="delete-volume"
          danger
          label="Delete"
          title=${'Delete ' + vol.name}
          fields=${[{ name: 'recursive', label: 'Delete its snapshots too', type: 'checkbox', initial: vol.snapshots > 0 }]}
          confirm=${`Delete volume "${vol.name}" and all its disks? This cannot be undone.`}
          run=${(v) => api.deleteVolume(vol.name, v.recursive)}
          done=${() => {
            location.hash = '#/volumes';
          }}
        />
      </div>`}
    </div>
    ${notice && html`<div class="notice" role="status">${notice}</div>`}
    <dl class="facts">
      <dt>Capacity</dt><dd>${bytes(vol.capacity)}</dd>
      <dt>Created</dt><dd>${time(vol.createdAt)}</dd>
      ${vol.tenant && html`<dt>Tenant</dt><dd>${vol.tenant}</dd>`}
      <dt>Labels</dt><dd>${labels(vol.labels) || '—'}</dd>
      ${vol.encryption &&
      html`<dt>Encryption</dt>
        <dd data-encryption>${encryption(vol.encryption)}</dd>`}
      ${vol.source &&
      html`<dt>Cloned from</dt>
        <dd data-source>
          <a href=${'#/volumes/' + encodeURIComponent(vol.source.volume)}>${vol.source.volume}</a>
          ${vol.source.snapshot ? '@' + vol.source.snapshot : ' (live)'}
        </dd>`}
      <dt>Writer</dt>
      <dd data-writer=${writer ? writer.id : ''}>
        ${writer ? `${writer.node} (attachment ${writer.id}, epoch ${vol.writer && vol.writer.epoch})` : 'none connected'}
      </dd>
      <dt>Fenced</dt>
      <dd data-fenced=${fenced.map((a) => a.id).join(' ')} class=${fenced.length ? 'bad' : ''}>
        ${fenced.length ? fenced.map((a) => `${a.node} (attachment ${a.id})`).join(', ') : 'none'}
      </dd>
      ${vol.qos && html`<dt>QoS</dt><dd>${qos(vol.qos)}</dd>`}
    </dl>

    <h3>Disks</h3>
    <table class="grid" data-table="disks">
      <thead><tr><th>Name</th><th>Size</th><th>Allocated</th><th>Shared</th>${canWrite && html`<th></th>`}</tr></thead>
      <tbody>
        ${(vol.disks || []).map(
          (d) => html`<tr data-disk=${d.name}>
            <td>${d.name}</td><td data-size=${d.size}>${bytes(d.size)}</td><td>${bytes(d.allocated)}</td><td>${d.shared ? 'yes' : ''}</td>
            ${canWrite &&
            html`<td class="actions">
              <${Action}
                id=${'grow-' + d.name}
                label="Grow"
                title=${`Grow disk ${d.name} of ${vol.name}`}
                fields=${[{ name: 'size', label: 'New size (GiB, or 512M, 2T)', initial: String(d.size / 2 ** 30) }]}
                confirm="A disk only grows; the VM sees the new size at its next size check."
                run=${(v) => api.growDisk(vol.name, d.name, parseSize(v.size))}
                done=${(_, v) => after(`Disk ${d.name} grown to ${bytes(parseSize(v.size))}.`)()}
              />
            </td>`}
          </tr>`,
        )}
      </tbody>
    </table>

    <h3>I/O</h3>
    <${IOChart} name=${vol.name} qos=${vol.qos} />

    <h3>Snapshots</h3>
    ${snaps.length === 0
      ? html`<p class="dim">No snapshots.</p>`
      : html`<table class="grid" data-table="snapshots">
          <thead><tr><th>Name</th><th>Taken</th><th>Method</th><th>Disks</th>${canWrite && html`<th></th>`}</tr></thead>
          <tbody>
            ${snaps.map(
              (s) => html`<tr data-snapshot=${s.name}>
                <td>${s.name}</td>
                <td>${time(s.createdAt)}</td>
                <td>${s.method}</td>
                <td>${(s.disks || []).map((d) => d.name).join(', ')}</td>
                ${canWrite &&
                html`<td class="actions">
                  <${Action}
                    id=${'clone-snapshot-' + s.name}
                    label="Clone"
                    title=${`Clone ${vol.name}@${s.name}`}
                    fields=${[{ name: 'names', label: 'New volume name(s), comma-separated' }]}
                    run=${(v) => api.clone({ volume: vol.name, snapshot: s.name }, splitNames(v.names))}
                    done=${(l) => after(`Cloned to ${l.items.map((x) => x.name).join(', ')}.`)()}
                  />
                  <${Action}
                    id=${'rollback-' + s.name}
                    danger
                    label="Rollback"
                    title=${`Roll ${vol.name} back to ${s.name}`}
                    confirm=${`Every disk of ${vol.name} returns to snapshot ${s.name}; later writes are lost. The server refuses while a writer is connected.`}
                    run=${() => api.rollback(vol.name, s.name)}
                    done=${after(`Rolled back to ${s.name}.`)}
                  />
                  <${Action}
                    id=${'delete-snapshot-' + s.name}
                    danger
                    label="Delete"
                    title=${`Delete snapshot ${s.name}`}
                    confirm=${`Delete snapshot ${vol.name}@${s.name}?`}
                    run=${() => api.deleteSnapshot(vol.name, s.name)}
                    done=${after(`Snapshot ${s.name} deleted.`)}
                  />
                </td>`}
              </tr>`,
            )}
          </tbody>
        </table>`}

    <h3>Lineage</h3>
    ${vols ? html`<${Lineage} vol=${vol} vols=${vols} snaps=${snaps} />` : html`<p class="loading">Loading…</p>`}

    <h3>Attachments</h3>
    ${atts.length === 0
      ? html`<p class="dim">Not attached.</p>`
      : html`<table class="grid" data-table="attachments">
          <thead><tr><th>ID</th><th>Node</th><th>Mode</th><th>State</th><th>Connections</th><th>Since</th></tr></thead>
          <tbody>
            ${atts.map(
              (a) => html`<tr data-attachment=${a.id} data-state=${a.state}>
                <td>${a.id}</td>
                <td>${a.node}${a.implicit ? ' (implicit)' : ''}</td>
                <td>${a.mode}</td>
                <td class=${a.state === 'fenced' ? 'bad' : a.state === 'writer' ? 'ok' : ''}>${a.state}</td>
                <td>${a.connections}</td>
                <td>${time(a.createdAt)}</td>
              </tr>`,
            )}
          </tbody>
        </table>`}

    <h3>Copies</h3>
    <${Copies} vol=${vol} />

    <h3>Backups</h3>
    <${Backups} vol=${vol} />

    <h3>DR</h3>
    <${DR} vol=${vol} />
  </section>`;
}

function splitNames(s) {
  return s
    .split(/[\s,]+/)
    .map((x) => x.trim())
    .filter(Boolean);
}

function qos(q) {
  return Object.entries(q)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
}

// parseQoS reads the QoS dialog: an empty field is no limit.
function parseQoS(v) {
  const q = {};
  for (const [n, l] of qosFields) {
    const x = (v[n] || '').trim();
    if (x === '' || x === '0') continue;
    if (!/^\d+$/.test(x)) throw new APIError(0, 'Invalid', `${l}: "${x}" is not a whole number`, n);
    q[n] = Number(x);
  }
  return q;
}

// parseLabels reads "k=v, k2=v2" as a map; the server checks the keys.
function parseLabels(s) {
  const l = {};
  for (const item of s.split(',').map((x) => x.trim()).filter(Boolean)) {
    const i = item.indexOf('=');
    if (i < 0) throw new APIError(0, 'Invalid', `label "${item}": want key=value`, 'labels');
    l[item.slice(0, i).trim()] = item.slice(i + 1).trim();
  }
  return l;
}

// encryption describes an encrypted volume's key, and a deep rekey under
// way or interrupted, from the API's encryption field.
function encryption(e) {
  let s = `XTS-AES-256, data key wrapped by KEK ${e.keyId} of ${e.provider}`;
  const r = e.rekey;
  if (r) {
    const pct = r.totalBytes > 0 ? Math.floor((100 * r.doneBytes) / r.totalBytes) : 0;
    s += `; deep rekey ${pct}% (${bytes(r.doneBytes)} of ${bytes(r.totalBytes)}), ${
      r.running ? 'running' : 'interrupted: run quiver volume rekey --deep to finish it'
    }`;
  }
  return s;
}
