// The console's only source of data: quiver's v1 HTTP API, called with the
// user's own bearer token (kept in sessionStorage, gone with the tab).

const tokenKey = 'quiver.token';

export function token() {
  return sessionStorage.getItem(tokenKey);
}

export function setToken(t) {
  if (t === null) sessionStorage.removeItem(tokenKey);
  else sessionStorage.setItem(tokenKey, t);
}

// APIError carries the server's error body: its stable code, its message
// and the field it names.
export class APIError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

// call sends one request and returns the decoded JSON answer (null for
// 204); a non-2xx answer throws an APIError with the server's message.
export async function call(method, path, body, tok = token()) {
  const headers = {};
  if (tok) headers.Authorization = 'Bearer ' + tok;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'omit',
    });
  } catch (e) {
    throw new APIError(0, 'Unreachable', 'the server did not answer: ' + e.message);
  }
  if (res.status === 204) return null;
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!res.ok) {
    const e = data && data.error;
    if (e) throw new APIError(res.status, e.code, e.message, e.field);
    throw new APIError(res.status, 'HTTP ' + res.status, text.trim() || res.statusText);
  }
  return data;
}

const enc = encodeURIComponent;

export const api = {
  whoami: (tok) => call('GET', '/v1/whoami', undefined, tok),
  version: () => call('GET', '/v1/version'),
  pool: () => call('GET', '/v1/pool'),
  nodes: () => call('GET', '/v1/nodes'),
  jobs: () => call('GET', '/v1/jobs'),
  cancelJob: (id) => call('DELETE', `/v1/jobs/${enc(id)}`),
  volumes: () => call('GET', '/v1/volumes'),
  volume: (v) => call('GET', `/v1/volumes/${enc(v)}`),
  createVolume: (spec) => call('POST', '/v1/volumes', spec),
  deleteVolume: (v, recursive) =>
    call('DELETE', `/v1/volumes/${enc(v)}` + (recursive ? '?recursive=true' : '')),
  snapshots: (v) => call('GET', `/v1/volumes/${enc(v)}/snapshots`),
  createSnapshot: (v, name) => call('POST', `/v1/volumes/${enc(v)}/snapshots`, { name }),
  deleteSnapshot: (v, s) => call('DELETE', `/v1/volumes/${enc(v)}/snapshots/${enc(s)}`),
  rollback: (v, snapshot) => call('POST', `/v1/volumes/${enc(v)}/rollback`, { snapshot }),
  clone: (source, names) => call('POST', '/v1/clones', { source, names }),
  attachments: (v) => call('GET', `/v1/volumes/${enc(v)}/attachments`),
  backupTargets: () => call('GET', '/v1/backup-targets'),
  backups: (target, v) => call('GET', `/v1/backups?target=${enc(target)}&volume=${enc(v)}`),
  drStatus: () => call('GET', '/v1/dr/status'),
  stats: (v) => call('GET', `/v1/volumes/${enc(v)}/stats`),
  updateVolume: (v, update) => call('PATCH', `/v1/volumes/${enc(v)}`, update),
  addDisk: (v, spec) => call('POST', `/v1/volumes/${enc(v)}/disks`, spec),
  growDisk: (v, d, size) => call('PATCH', `/v1/volumes/${enc(v)}/disks/${enc(d)}`, { size }),
  events: (after, since) =>
    call('GET', '/v1/events?' + (after ? 'after=' + after : 'since=' + enc(since.toISOString()))),
  ready: async () => {
    const res = await fetch('/readyz', { credentials: 'omit' });
    return res.ok;
  },
};
