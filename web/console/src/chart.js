// The live I/O of a volume: its counters (GET /v1/volumes/{v}/stats) read
// every second; the difference of two readings is a point of the IOPS and
// MB/s charts, drawn as SVG polylines. The newest rates are also in the
// element's data attributes (data-iops, data-mbps, data-samples).
import { useEffect, useState } from 'preact/hooks';
import { api } from './api.js';
import { html } from './ui.js';

const keep = 60; // points shown: the last minute

export function IOChart({ name, qos }) {
  const [points, setPoints] = useState([]);
  const [error, setError] = useState(null);
  useEffect(() => {
    let prev = null;
    let stopped = false;
    const poll = async () => {
      try {
        const s = await api.stats(name);
        if (stopped) return;
        setError(null);
        if (prev) {
          const dt = (Date.parse(s.time) - Date.parse(prev.time)) / 1000;
          if (dt > 0) {
            const p = {
              iops: (s.readOps - prev.readOps + s.writeOps - prev.writeOps) / dt,
              mbps: (s.readBytes - prev.readBytes + s.writeBytes - prev.writeBytes) / dt / 1e6,
            };
            setPoints((l) => [...l.slice(1 - keep), p]);
          }
        }
        prev = s;
      } catch (e) {
        if (!stopped) setError(e);
      }
    };
    poll();
    const id = setInterval(poll, 1000);
    return () => {
      stopped = true;
      clearInterval(id);
    };
  }, [name]);

  const last = points[points.length - 1] || { iops: 0, mbps: 0 };
  const iopsLimit = qos && (qos.rwIOPS || 0);
  const mbLimit = qos && (qos.rwMBytes || 0);
  return html`<div
    class="io"
    data-io=${name}
    data-iops=${Math.round(last.iops)}
    data-mbps=${last.mbps.toFixed(2)}
    data-samples=${points.length}
  >
    ${error && html`<p class="dim">I/O counters: ${error.code || ''} ${error.message}</p>`}
    <${Plot} label="IOPS" unit="" points=${points.map((p) => p.iops)} value=${Math.round(last.iops)} limit=${iopsLimit} />
    <${Plot} label="MB/s" unit="" points=${points.map((p) => p.mbps)} value=${last.mbps.toFixed(1)} limit=${mbLimit} />
  </div>`;
}

const W = 360;
const H = 90;

function Plot({ label, points, value, limit }) {
  const max = Math.max(1, limit || 0, ...points) * 1.1;
  const y = (v) => (H - (v / max) * H).toFixed(1);
  const x = (i) => ((W * (i + keep - points.length)) / (keep - 1)).toFixed(1);
  const line = points.map((v, i) => x(i) + ',' + y(v)).join(' ');
  return html`<figure class="plot">
    <figcaption>${label} <strong>${value}</strong>${limit ? html` <span class="dim">limit ${limit}</span>` : ''}</figcaption>
    <svg viewBox=${`0 0 ${W} ${H}`} width=${W} height=${H} role="img" aria-label=${label}>
      <rect width=${W} height=${H} class="bg" />
      ${limit ? html`<line x1="0" x2=${W} y1=${y(limit)} y2=${y(limit)} class="limit" />` : ''}
      ${points.length > 1 && html`<polyline points=${line} class="line" />`}
    </svg>
  </figure>`;
}
