// The volume (VM) list: search, sort, and only the rows in view rendered,
// so that 10,000 volumes scroll as fast as 10.
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { api } from './api.js';
import { bytes, labels, parseSize, time, timeKey } from './format.js';
import { html, Action, ErrorBox } from './ui.js';

const rowHeight = 34; // px, as .vlist .row in style.css
const overscan = 10;

const columns = [
  { key: 'name', label: 'Name', value: (v) => v.name },
  { key: 'disks', label: 'Disks', value: (v) => (v.disks || []).length },
  { key: 'size', label: 'Size', value: (v) => diskBytes(v), show: (v) => bytes(diskBytes(v)) },
  { key: 'capacity', label: 'Capacity', value: (v) => v.capacity || 0, show: (v) => bytes(v.capacity) },
  { key: 'snapshots', label: 'Snapshots', value: (v) => v.snapshots || 0 },
  { key: 'labels', label: 'Labels', value: (v) => labels(v.labels) },
  { key: 'created', label: 'Created', value: (v) => timeKey(v.createdAt), show: (v) => time(v.createdAt) },
];

function diskBytes(v) {
  return (v.disks || []).reduce((s, d) => s + d.size, 0);
}

export function Volumes({ canWrite }) {
  const [vols, setVols] = useState(null);
  const [error, setError] = useState(null);
  const [query, setQuery] = useState('');
  const [sort, setSort] = useState({ key: 'name', dir: 1 });
  const [scroll, setScroll] = useState(0);
  const [height, setHeight] = useState(600);
  const box = useRef(null);

  const load = () => api.volumes().then((l) => setVols(l.items), setError);
  useEffect(() => {
    load();
  }, []);
  useEffect(() => {
    if (box.current) setHeight(box.current.clientHeight);
  }, [vols]);

  const rows = useMemo(() => {
    if (!vols) return [];
    const q = query.trim().toLowerCase();
    const col = columns.find((c) => c.key === sort.key);
    const match = q
      ? vols.filter((v) => v.name.toLowerCase().includes(q) || labels(v.labels).toLowerCase().includes(q))
      : vols.slice();
    return match.sort((a, b) => {
      const x = col.value(a);
      const y = col.value(b);
      return (x < y ? -1 : x > y ? 1 : 0) * sort.dir;
    });
  }, [vols, query, sort]);

  if (error) return html`<${ErrorBox} error=${error} />`;
  if (!vols) return html`<p class="loading">Loading…</p>`;

  const first = Math.max(0, Math.floor(scroll / rowHeight) - overscan);
  const last = Math.min(rows.length, Math.ceil((scroll + height) / rowHeight) + overscan);
  const toggle = (key) => setSort(sort.key === key ? { key, dir: -sort.dir } : { key, dir: 1 });

  return html`<section class="volumes">
    <div class="toolbar">
      <h2>Volumes</h2>
      <input
        type="search"
        name="search"
        placeholder="Search by name or label"
        value=${query}
        onInput=${(e) => {
          setQuery(e.target.value);
          setScroll(0);
          if (box.current) box.current.scrollTop = 0;
        }}
      />
      <span class="count" data-count=${rows.length}>${rows.length} of ${vols.length}</span>
      ${canWrite &&
      html`<${Action}
        id="create-volume"
        label="Create volume"
        title="Create a volume"
        fields=${[
          { name: 'name', label: 'Name', placeholder: 'web01' },
          { name: 'size', label: 'Root disk size (GiB, or 512M)', initial: '10' },
          { name: 'disks', label: 'Disks', initial: '1', options: ['1', '2', '3', '4'] },
        ]}
        confirm=${(v) => `Create volume "${v.name}" with ${v.disks} disk(s) of ${v.size}?`}
        run=${(v) => {
          const size = parseSize(v.size);
          const n = parseInt(v.disks, 10) || 1;
          const disks = [];
          for (let i = 0; i < n; i++) disks.push({ name: i === 0 ? 'root' : 'data' + i, size });
          return api.createVolume({ name: v.name.trim(), capacity: size * n, disks });
        }}
        done=${(vol) => {
          location.hash = '#/volumes/' + encodeURIComponent(vol.name);
        }}
      />`}
    </div>
    <div class="vlist" role="table">
      <div class="row head" role="row">
        ${columns.map(
          (c) => html`<div role="columnheader" class=${'c-' + c.key} data-sort=${c.key} onClick=${() => toggle(c.key)}>
            ${c.label}${sort.key === c.key ? (sort.dir > 0 ? ' ▲' : ' ▼') : ''}
          </div>`,
        )}
      </div>
      <div class="body" ref=${box} onScroll=${(e) => setScroll(e.target.scrollTop)}>
        <div style=${{ height: rows.length * rowHeight + 'px', position: 'relative' }}>
          ${rows.slice(first, last).map(
            (v, i) => html`<a
              class="row"
              role="row"
              data-volume=${v.name}
              href=${'#/volumes/' + encodeURIComponent(v.name)}
              style=${{ top: (first + i) * rowHeight + 'px' }}
            >
              ${columns.map(
                (c) => html`<div role="cell" class=${'c-' + c.key}>${c.show ? c.show(v) : c.value(v)}</div>`,
              )}
            </a>`,
          )}
        </div>
      </div>
    </div>
  </section>`;
}
