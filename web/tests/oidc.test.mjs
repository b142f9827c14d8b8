// Signing in to the dashboard with the organisation's identity provider (a stand-in one:
// tests/oidc-provider.mjs): the authorization-code flow with PKCE, then silent refreshes
// that keep the tab signed in after the first access token has expired.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { eventually, launchBrowser, startBerth } from "./berth.mjs";
import { startProvider } from "./oidc-provider.mjs";

const CLIENT = "berth-dashboard";
// Short-lived access tokens, so that the test sees them expire and be refreshed.
const TTL = 6;

let provider;
let berth;
let browser;

before(async () => {
  provider = await startProvider({ clientId: CLIENT, subject: "alice", accessTtl: TTL });
  berth = await startBerth({
    BERTH_OIDC_ISSUER: provider.issuer,
    BERTH_OIDC_WEB_CLIENT_ID: CLIENT,
    // No grace on `exp`: an expired token is refused at once.
    BERTH_TOKEN_LEEWAY_SECONDS: "0",
  });
  browser = await launchBrowser();
  await berth.call("PUT", "/api/v1/teams/nlp", { spec: {} });
  await berth.call("POST", "/api/v1/role-bindings", { subject: "alice", role: "member", team: "nlp" });
});

after(async () => {
  await browser?.close();
  await berth?.stop();
  await provider?.stop();
});

test("the server names the provider and the dashboard's client, publicly", async () => {
  const config = await (await fetch(`${berth.origin}/auth/config`)).json();
  assert.deepEqual(config.oidc, { issuer: provider.issuer, web_client_id: CLIENT, audience: "berth" });
  // The dashboard's scripts may reach the provider, and no other site.
  const csp = (await fetch(`${berth.origin}/`)).headers.get("content-security-policy");
  assert.match(csp, new RegExp(`connect-src 'self' ${provider.issuer}(;|$)`));
});

test("a user signs in at the provider, comes back signed in, and stays signed in past the token's expiry", async () => {
  const page = await browser.newPage();
  const used = [];
  page.on("request", (r) => {
    const auth = r.headers().authorization;
    if (r.url().startsWith(`${berth.origin}/api/`) && auth) used.push(auth.slice("Bearer ".length));
  });
  const refused = [];
  page.on("response", (r) => r.url().startsWith(`${berth.origin}/api/`) && r.status() === 401 && refused.push(r.url()));
  await page.goto(`${berth.origin}/#/workloads`);
  await page.getByRole("button", { name: `Sign in with ${new URL(provider.issuer).host}` }).click();
  // At the provider: its page, reached with a PKCE challenge.
  await page.getByRole("heading", { name: "Stand-in provider" }).waitFor();
  const authorize = new URL(page.url());
  assert.equal(authorize.searchParams.get("client_id"), CLIENT);
  assert.equal(authorize.searchParams.get("code_challenge_method"), "S256");
  assert.equal(authorize.searchParams.get("redirect_uri"), `${berth.origin}/`);
  await page.getByRole("button", { name: "Approve" }).click();
  // Back at the dashboard, on the page the user asked for, with the code gone from the address.
  await page.locator(".who").filter({ hasText: "alice" }).waitFor();
  assert.equal(page.url(), `${berth.origin}/#/workloads`);
  assert.equal(provider.approvals, 1);
  assert.deepEqual(provider.tokenRequests.map((r) => r.grant_type), ["authorization_code"]);
  // The tokens are this tab's alone: nothing in localStorage.
  assert.equal(await page.evaluate(() => localStorage.length), 0);
  const first = used.at(-1);
  const expiry = JSON.parse(Buffer.from(first.split(".")[1], "base64url")).exp * 1000;
  // Before it expires, the dashboard trades its refresh token, with no user action.
  await eventually(async () => provider.tokenRequests.some((r) => r.grant_type === "refresh_token"), 2 * TTL * 1000);
  const refreshedAt = provider.tokenRequests.find((r) => r.grant_type === "refresh_token").at;
  assert.ok(refreshedAt < expiry, `refreshed ${expiry - refreshedAt} ms before expiry`);
  // After the first token has expired, the page still reads the API, with a newer token.
  await new Promise((r) => setTimeout(r, Math.max(0, expiry - Date.now()) + 1000));
  await page.getByRole("link", { name: "Queue" }).click();
  await page.getByRole("heading", { name: "Queue" }).waitFor();
  await eventually(async () => used.length > 0 && used.at(-1) !== first);
  const me = await (await fetch(`${berth.origin}/api/v1/me`, { headers: { Authorization: `Bearer ${used.at(-1)}` } })).json();
  assert.equal(me.subject, "alice");
  assert.equal((await fetch(`${berth.origin}/api/v1/me`, { headers: { Authorization: `Bearer ${first}` } })).status, 401);
  assert.deepEqual(refused, [], "no request of the page was refused");
  // A reload keeps the tab signed in; signing out forgets the session.
  await page.reload();
  await page.locator(".who").filter({ hasText: "alice" }).waitFor();
  await page.getByRole("button", { name: "Sign out" }).click();
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await page.close();
});

test("a return that this tab did not start is refused", async () => {
  const page = await browser.newPage();
  await page.goto(`${berth.origin}/?code=stolen&state=forged`);
  await page.getByRole("alert").filter({ hasText: "not started in this tab" }).waitFor();
  assert.equal(new URL(page.url()).search, "");
  assert.ok(!provider.tokenRequests.some((r) => r.grant_type === "authorization_code" && r.at > Date.now() - 1000));
  await page.close();
});

test("the sign-in page, with the provider's button, fits a 390 px screen", async () => {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await page.goto(`${berth.origin}/`);
  await page.getByRole("button", { name: `Sign in with ${new URL(provider.issuer).host}` }).waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0, `${overflow} px wider than the screen`);
  await page.close();
});
