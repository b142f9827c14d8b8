// A stand-in OpenID Connect provider for the browser tests: discovery, a JWKS, an
// authorization endpoint with an "Approve" page, and a token endpoint for the
// authorization-code flow with PKCE (public client) and rotating refresh tokens.
// Tokens are RS256 JWTs signed with a key made at start. Node built-ins only.

import { createHash, generateKeyPairSync, randomBytes, randomUUID, sign } from "node:crypto";
import { createServer } from "node:http";
import { URL, URLSearchParams } from "node:url";

const b64url = (buf) => Buffer.from(buf).toString("base64url");
const randomToken = () => b64url(randomBytes(32));
const escapeHtml = (s) =>
  String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

/// Starts the provider on 127.0.0.1 (a free port). `tokenRequests` records every successful
/// POST /token ({grant_type, at}); `approvals` counts redirects back with a code; `stop()` ends it.
export async function startProvider({ clientId, audience = "berth", subject = "alice", accessTtl = 10 }) {
  if (!clientId) throw new Error("startProvider needs a clientId");
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const kid = randomUUID();
  const { kty, n, e } = publicKey.export({ format: "jwk" });
  const codes = new Map(); // code -> { client_id, redirect_uri, code_challenge, scope, nonce, expires }
  const refreshTokens = new Map(); // refresh token -> { scope, used }
  const provider = { issuer: "", tokenRequests: [], approvals: 0, stop: null };

  // Signs `claims` as an RS256 JWT with this provider's key.
  const jwt = (claims) => {
    const head = b64url(JSON.stringify({ alg: "RS256", typ: "JWT", kid }));
    const body = b64url(JSON.stringify(claims));
    return `${head}.${body}.${b64url(sign("RSA-SHA256", Buffer.from(`${head}.${body}`), privateKey))}`;
  };

  // The checks /authorize makes (GET and POST alike); returns a reason, or null when fine.
  const badAuthorize = (p) => {
    if (p.get("response_type") !== "code") return "response_type must be code";
    if (p.get("client_id") !== clientId) return "unknown client_id";
    if (!p.get("code_challenge")) return "code_challenge is required";
    if (p.get("code_challenge_method") !== "S256") return "code_challenge_method must be S256";
    let uri;
    try { uri = new URL(p.get("redirect_uri") ?? ""); } catch { return "redirect_uri is not a URL"; }
    if (uri.protocol !== "http:" && uri.protocol !== "https:") return "redirect_uri must be http(s)";
    return null;
  };

  // Issues an access token, an ID token and a fresh refresh token.
  const issueTokens = (grant_type, scope, nonce) => {
    const iat = Math.floor(Date.now() / 1000);
    const common = { iss: provider.issuer, sub: subject, iat, nbf: iat, exp: iat + accessTtl,
      name: subject, preferred_username: subject, azp: clientId };
    const refresh_token = randomToken();
    refreshTokens.set(refresh_token, { scope, used: false });
    provider.tokenRequests.push({ grant_type, at: Date.now() });
    return {
      access_token: jwt({ ...common, aud: audience, scope, jti: randomUUID() }),
      id_token: jwt({ ...common, aud: clientId, ...(nonce ? { nonce } : {}) }),
      token_type: "Bearer", expires_in: accessTtl, refresh_token, scope,
    };
  };

  // The token endpoint's logic: returns [status, body].
  const token = (p) => {
    const fail = (error, error_description) => [400, { error, error_description }];
    const grant = p.get("grant_type");
    if (!grant) return fail("invalid_request", "grant_type is required");
    if (grant !== "authorization_code" && grant !== "refresh_token") return fail("unsupported_grant_type", `unsupported grant_type ${grant}`);
    if (!p.get("client_id")) return fail("invalid_request", "client_id is required");
    if (p.get("client_id") !== clientId) return fail("invalid_client", "unknown client_id");
    if (grant === "authorization_code") {
      const code = p.get("code"), verifier = p.get("code_verifier");
      if (!code || !verifier || !p.get("redirect_uri")) return fail("invalid_request", "code, code_verifier and redirect_uri are required");
      const grantRec = codes.get(code);
      codes.delete(code); // one try per code, right or wrong
      if (!grantRec || grantRec.expires < Date.now()) return fail("invalid_grant", "unknown, used or expired code");
      if (grantRec.client_id !== p.get("client_id")) return fail("invalid_grant", "code was issued to another client");
      if (grantRec.redirect_uri !== p.get("redirect_uri")) return fail("invalid_grant", "redirect_uri differs from the one at /authorize");
      if (b64url(createHash("sha256").update(verifier).digest()) !== grantRec.code_challenge) return fail("invalid_grant", "code_verifier does not match code_challenge");
      return [200, issueTokens(grant, grantRec.scope, grantRec.nonce)];
    }
    const rt = p.get("refresh_token");
    if (!rt) return fail("invalid_request", "refresh_token is required");
    const rec = refreshTokens.get(rt);
    if (!rec || rec.used) return fail("invalid_grant", "unknown or already used refresh_token");
    rec.used = true; // rotation: each refresh token works once
    return [200, issueTokens(grant, rec.scope)];
  };

  const server = createServer(async (req, res) => {
    const send = (status, body, headers = {}) => {
      const json = typeof body === "object";
      res.writeHead(status, { "Access-Control-Allow-Origin": "*",
        "Content-Type": json ? "application/json" : "text/plain; charset=utf-8", ...headers });
      res.end(json ? JSON.stringify(body) : body);
    };
    const url = new URL(req.url, provider.issuer);
    let form = new URLSearchParams();
    if (req.method === "POST") {
      let raw = "";
      for await (const chunk of req) raw += chunk;
      form = new URLSearchParams(raw);
    }
    const route = `${req.method} ${url.pathname}`;

    // CORS preflight: allow any origin to POST forms and fetch JSON.
    if (req.method === "OPTIONS") {
      res.writeHead(204, { "Access-Control-Allow-Origin": "*", "Access-Control-Allow-Headers": "Content-Type",
        "Access-Control-Allow-Methods": "GET, POST" });
      return res.end();
    }
    // Discovery document.
    if (route === "GET /.well-known/openid-configuration") {
      const iss = provider.issuer;
      return send(200, { issuer: iss, authorization_endpoint: `${iss}/authorize`, token_endpoint: `${iss}/token`,
        jwks_uri: `${iss}/jwks`, response_types_supported: ["code"],
        grant_types_supported: ["authorization_code", "refresh_token"], code_challenge_methods_supported: ["S256"],
        id_token_signing_alg_values_supported: ["RS256"], subject_types_supported: ["public"] });
    }
    // The public signing key.
    if (route === "GET /jwks") return send(200, { keys: [{ kty, n, e, kid, alg: "RS256", use: "sig" }] });
    // Authorization request: checks it, then shows an "Approve" page carrying its parameters.
    if (route === "GET /authorize") {
      const bad = badAuthorize(url.searchParams);
      if (bad) return send(400, bad);
      const inputs = [...url.searchParams]
        .map(([k, v]) => `<input type=hidden name="${escapeHtml(k)}" value="${escapeHtml(v)}">`).join("");
      return send(200, `<!doctype html><title>Stand-in provider</title><h1>Stand-in provider</h1>` +
        `<form method="post" action="/authorize">${inputs}<button>Approve</button></form>`,
        { "Content-Type": "text/html; charset=utf-8" });
    }
    // Approval: issues a one-time code (60 s) and redirects back with code and state.
    if (route === "POST /authorize") {
      const bad = badAuthorize(form);
      if (bad) return send(400, bad);
      const code = randomToken();
      codes.set(code, { client_id: form.get("client_id"), redirect_uri: form.get("redirect_uri"),
        code_challenge: form.get("code_challenge"), scope: form.get("scope") ?? "openid",
        nonce: form.get("nonce"), expires: Date.now() + 60_000 });
      provider.approvals++;
      const back = new URL(form.get("redirect_uri"));
      back.searchParams.set("code", code);
      if (form.has("state")) back.searchParams.set("state", form.get("state"));
      return send(302, "", { Location: back.href });
    }
    // Token endpoint: code exchange (with PKCE) and refresh.
    if (route === "POST /token") {
      const [status, body] = token(form);
      return send(status, body, { "Cache-Control": "no-store", Pragma: "no-cache" });
    }
    send(404, "not found");
  });

  await new Promise((done, fail) => {
    server.once("error", fail);
    server.listen(0, "127.0.0.1", done);
  });
  provider.issuer = `http://127.0.0.1:${server.address().port}`;
  provider.stop = () => new Promise((done) => {
    server.close(() => done());
    server.closeAllConnections(); // browsers keep connections alive
  });
  return provider;
}
