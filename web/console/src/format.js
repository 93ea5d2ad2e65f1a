// Display helpers.

const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

export function bytes(n) {
  if (n === undefined || n === null) return '';
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (i === 0 ? String(v) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + units[i];
}

const gib = 1024 * 1024 * 1024;

// parseSize reads "10", "10G", "10Gi", "512M" as bytes (GiB by default).
export function parseSize(s) {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$/i.exec(s);
  if (!m) return NaN;
  const mult = { '': gib, K: 1024, M: 1024 ** 2, G: gib, T: 1024 * gib }[m[2].toUpperCase()];
  return Math.round((parseFloat(m[1]) * mult) / 512) * 512;
}

export function time(s) {
  if (!s) return '';
  const d = new Date(s);
  return isNaN(d) ? s : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function labels(l) {
  if (!l) return '';
  return Object.keys(l)
    .sort()
    .map((k) => `${k}=${l[k]}`)
    .join(', ');
}

// timeKey makes the API's times (RFC 3339, their fractional seconds cut
// short of trailing zeros, as Go writes them) comparable as strings: the
// fraction padded to nine digits. "08.12Z" sorts before "08.123Z".
export function timeKey(s) {
  if (!s) return '';
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(s);
  return m ? m[1] + '.' + (m[2] || '').padEnd(9, '0') + m[3] : s;
}

// byTime compares two of the API's times, the older first.
export function byTime(a, b) {
  const x = timeKey(a);
  const y = timeKey(b);
  return x < y ? -1 : x > y ? 1 : 0;
}
