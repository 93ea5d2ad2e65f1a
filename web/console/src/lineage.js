// A volume's lineage, from the volume list alone (each volume names its
// source: a volume and, unless it was cloned live, a snapshot of it): the
// chain of sources above the volume, and below it the tree of its
// snapshots and of the volumes cloned from it or from them, their own
// clones beneath them.
import { html } from './ui.js';
import { byTime, time } from './format.js';

const link = (v) => html`<a href=${'#/volumes/' + encodeURIComponent(v)}>${v}</a>`;

// ancestry returns the sources above vol, the oldest first: [{volume,
// snapshot}], from vol's source to the source that has none (or that the
// token does not see).
export function ancestry(vol, byName) {
  const out = [];
  const seen = new Set([vol.name]);
  for (let src = vol.source; src && !seen.has(src.volume); ) {
    out.unshift(src);
    seen.add(src.volume);
    const up = byName.get(src.volume);
    src = up && up.source;
  }
  return out;
}

// childrenOf indexes the volumes by their source: "v" for live clones of
// v, "v@s" for clones of its snapshot s.
export function childrenOf(vols) {
  const m = new Map();
  for (const v of vols) {
    if (!v.source) continue;
    const k = v.source.snapshot ? v.source.volume + '@' + v.source.snapshot : v.source.volume;
    if (!m.has(k)) m.set(k, []);
    m.get(k).push(v);
  }
  for (const l of m.values()) l.sort((a, b) => byTime(a.createdAt, b.createdAt));
  return m;
}

// Lineage draws the chain above vol and the tree below it; snaps are vol's
// snapshots (the other volumes' snapshots appear only as sources of
// clones).
export function Lineage({ vol, vols, snaps }) {
  const byName = new Map(vols.map((v) => [v.name, v]));
  const kids = childrenOf(vols);
  const up = ancestry(vol, byName);
  const seen = new Set();

  const volumeNode = (name, own, label) => {
    seen.add(name);
    // Snapshots: vol's own (with their time), then those its clones name
    // that it no longer has.
    const named = [...kids.keys()]
      .filter((k) => k.startsWith(name + '@'))
      .map((k) => k.slice(name.length + 1));
    const list = own
      ? own.map((s) => ({ name: s.name, at: s.createdAt })).sort((a, b) => byTime(a.at, b.at))
      : [];
    for (const s of named) if (!list.some((x) => x.name === s)) list.push({ name: s, gone: !!own });
    const clones = (k) => (kids.get(k) || []).filter((c) => !seen.has(c.name));
    return html`<li data-node=${'volume:' + name}>
      <span class=${own ? 'node self' : 'node'}>${own ? html`<strong>${name}</strong>` : link(name)}${label}</span>
      <ul>
        ${list.map(
          (s) => html`<li data-node=${'snapshot:' + name + '@' + s.name}>
            <span class="node snap">◉ ${s.name}${s.at ? html` <span class="dim">${time(s.at)}</span>` : ''}${s.gone
                ? html` <span class="dim">(deleted)</span>`
                : ''}</span>
            <ul>
              ${clones(name + '@' + s.name).map((c) => volumeNode(c.name, null, ''))}
            </ul>
          </li>`,
        )}
        ${clones(name).map((c) => volumeNode(c.name, null, html` <span class="dim">(live clone)</span>`))}
      </ul>
    </li>`;
  };

  return html`<div class="lineage">
    <p data-ancestry>
      ${up.length === 0
        ? html`<span class="dim">Not a clone.</span>`
        : up.map((s) => html`${link(s.volume)}${s.snapshot ? '@' + s.snapshot : ' (live)'} → `)}
      ${up.length > 0 && html`<strong>${vol.name}</strong>`}
    </p>
    <ul class="tree" data-tree>
      ${volumeNode(vol.name, snaps, '')}
    </ul>
  </div>`;
}
