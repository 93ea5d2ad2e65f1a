// quiver's web console: a token login, then the overview, the volume list,
// each volume's page, the jobs and the audit log, all from the v1 API (hash routes: the server
// serves one page).
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { api, setToken, token } from './api.js';
import { html, ErrorBox } from './ui.js';
import { Overview } from './overview.js';
import { Volumes } from './volumes.js';
import { Volume } from './volume.js';
import { Jobs } from './jobs.js';
import { Events } from './events.js';
import './style.css';

// Roles that may change volumes (docs/api.md: every change but attachments
// and tokens is open to admin and tenant).
const writers = new Set(['admin', 'tenant']);

function useHash() {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = () => setHash(location.hash);
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return hash;
}

function Login({ onLogin, error: initial }) {
  const [tok, setTok] = useState('');
  const [error, setError] = useState(initial);
  const [busy, setBusy] = useState(false);
  const submit = async (e) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const me = await api.whoami(tok.trim());
      setToken(tok.trim());
      onLogin(me);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`<form class="login" onSubmit=${submit}>
    <h1>quiver</h1>
    <label>
      API token
      <input type="password" name="token" autocomplete="off" value=${tok} onInput=${(e) => setTok(e.target.value)} />
    </label>
    <p class="dim">The token stays in this tab (sessionStorage) and goes only to this server's API.</p>
    <${ErrorBox} error=${error} />
    <button class="primary" type="submit" disabled=${busy}>Sign in</button>
  </form>`;
}

function App() {
  const hash = useHash();
  const [me, setMe] = useState(undefined); // undefined: checking; null: signed out
  useEffect(() => {
    const t = token();
    if (t === null) {
      setMe(null);
      return;
    }
    api.whoami(t).then(setMe, () => {
      setToken(null);
      setMe(null);
    });
  }, []);

  if (me === undefined) return html`<p class="loading">Loading…</p>`;
  if (me === null) return html`<${Login} onLogin=${setMe} />`;

  const canWrite = writers.has(me.role);
  const signOut = () => {
    setToken(null);
    setMe(null);
    location.hash = '';
  };
  let page;
  const m = /^#\/volumes\/(.+)$/.exec(hash);
  if (m) page = html`<${Volume} key=${m[1]} name=${decodeURIComponent(m[1])} canWrite=${canWrite} />`;
  else if (hash === '#/volumes') page = html`<${Volumes} canWrite=${canWrite} />`;
  else if (hash === '#/jobs') page = html`<${Jobs} canWrite=${canWrite} />`;
  else if (hash === '#/events') page = html`<${Events} />`;
  else page = html`<${Overview} />`;
  const nav = (href, label, on) => html`<a href=${href} class=${on ? 'on' : ''}>${label}</a>`;
  return html`<div class="app">
    <header>
      <span class="brand">quiver</span>
      <nav>
        ${nav('#/', 'Overview', !/^#\/(volumes|jobs|events)/.test(hash))}
        ${nav('#/volumes', 'Volumes', hash.startsWith('#/volumes'))} ${nav('#/jobs', 'Jobs', hash === '#/jobs')}
        ${nav('#/events', 'Audit log', hash === '#/events')}
      </nav>
      <span class="me" data-role=${me.role}>
        ${me.role}${me.tenant ? ' of ' + me.tenant : ''}${me.tokenID ? ' · ' + me.tokenID : ''}
      </span>
      <button onClick=${signOut}>Sign out</button>
    </header>
    <main>${page}</main>
  </div>`;
}

render(html`<${App} />`, document.getElementById('app'));
