// Signing in with the organisation's identity provider: the OAuth 2.0 authorization-code
// flow with PKCE (RFC 7636) as a public client, redirected back to the dashboard, and a
// silent refresh with the provider's refresh token before the access token expires.

import { OidcLogin, saveSession, session } from "./api";

/// What this tab keeps between leaving for the provider and coming back.
const PENDING_KEY = "berth.oidc.pending";

interface Pending {
  state: string;
  verifier: string;
  redirect: string;
  /// The page to show after signing in.
  hash: string;
}

interface Discovery {
  authorization_endpoint: string;
  token_endpoint: string;
}

interface Tokens {
  access_token: string;
  refresh_token?: string;
  expires_in?: number;
}

const base64url = (bytes: Uint8Array) =>
  btoa(String.fromCharCode(...bytes))
    .replace(/\+/g, "-")
    .replace(/\//g, "_")
    .replace(/=+$/, "");

const random = (bytes: number) => base64url(crypto.getRandomValues(new Uint8Array(bytes)));

async function discover(issuer: string): Promise<Discovery> {
  const url = `${issuer.replace(/\/$/, "")}/.well-known/openid-configuration`;
  const r = await fetch(url);
  if (!r.ok) throw new Error(`the identity provider did not answer ${url} (${r.status})`);
  return r.json();
}

/// Leaves for the provider's sign-in page.
export async function beginSignIn(oidc: OidcLogin) {
  const discovery = await discover(oidc.issuer);
  const verifier = random(32);
  const challenge = base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier))));
  const pending: Pending = { state: random(16), verifier, redirect: location.origin + location.pathname, hash: location.hash };
  sessionStorage.setItem(PENDING_KEY, JSON.stringify(pending));
  const url = new URL(discovery.authorization_endpoint);
  for (const [k, v] of Object.entries({
    response_type: "code",
    client_id: oidc.web_client_id ?? "",
    redirect_uri: pending.redirect,
    scope: "openid offline_access",
    code_challenge: challenge,
    code_challenge_method: "S256",
    state: pending.state,
  }))
    url.searchParams.set(k, v);
  location.assign(url.toString());
}

/// Whether this page load is the provider sending the user back (`?code=…` or `?error=…`).
export function returningFromProvider(): boolean {
  const q = new URLSearchParams(location.search);
  return q.has("state") && (q.has("code") || q.has("error"));
}

/// Exchanges the code the provider sent back for tokens and keeps them; the address loses
/// the code either way.
export async function finishSignIn(oidc: OidcLogin): Promise<void> {
  const q = new URLSearchParams(location.search);
  const pending: Pending | null = JSON.parse(sessionStorage.getItem(PENDING_KEY) ?? "null");
  sessionStorage.removeItem(PENDING_KEY);
  history.replaceState(null, "", location.pathname + (pending?.hash ?? ""));
  const error = q.get("error");
  if (error) throw new Error(`the identity provider refused: ${q.get("error_description") ?? error}`);
  if (!pending || pending.state !== q.get("state")) throw new Error("this sign-in was not started in this tab: sign in again");
  const endpoint = (await discover(oidc.issuer)).token_endpoint;
  const client_id = oidc.web_client_id ?? "";
  const tokens = await tokenRequest(endpoint, {
    grant_type: "authorization_code",
    code: q.get("code") ?? "",
    redirect_uri: pending.redirect,
    client_id,
    code_verifier: pending.verifier,
  });
  keep(tokens, endpoint, client_id);
}

async function tokenRequest(endpoint: string, form: Record<string, string>): Promise<Tokens> {
  const r = await fetch(endpoint, {
    method: "POST",
    headers: { "Content-Type": "application/x-www-form-urlencoded", Accept: "application/json" },
    body: new URLSearchParams(form),
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok || !body.access_token)
    throw new Error(`the identity provider refused the token request: ${body.error_description ?? body.error ?? r.status}`);
  return body;
}

function keep(tokens: Tokens, endpoint: string, client_id: string) {
  saveSession({
    token: tokens.access_token,
    refresh: tokens.refresh_token
      ? { token: tokens.refresh_token, endpoint, client_id, expires_at: Date.now() + (tokens.expires_in ?? 300) * 1000 }
      : undefined,
  });
  scheduleRefresh();
}

let timer: ReturnType<typeof setTimeout> | undefined;
let inFlight: Promise<boolean> | null = null;

/// Refreshes the session's token a fifth of its life (at most a minute) before it expires,
/// for as long as the tab is open; nothing for a pasted token.
export function scheduleRefresh() {
  clearTimeout(timer);
  const r = session()?.refresh;
  if (!r) return;
  const left = r.expires_at - Date.now();
  timer = setTimeout(() => void refreshSession().catch(() => undefined), Math.max(0, left - Math.min(60_000, left / 5)));
}

/// Trades the refresh token for new tokens (one exchange at a time: the provider may
/// rotate refresh tokens, so a second use of the same one would fail).
export function refreshSession(): Promise<boolean> {
  inFlight ??= (async () => {
    try {
      const r = session()?.refresh;
      if (!r) return false;
      const tokens = await tokenRequest(r.endpoint, { grant_type: "refresh_token", refresh_token: r.token, client_id: r.client_id });
      // A provider that does not rotate sends no new refresh token: keep the old one.
      keep({ ...tokens, refresh_token: tokens.refresh_token ?? r.token }, r.endpoint, r.client_id);
      return true;
    } finally {
      inFlight = null;
    }
  })();
  return inFlight;
}

/// Stops refreshing (signing out).
export function stopRefresh() {
  clearTimeout(timer);
}
