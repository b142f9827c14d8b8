// The dashboard with 5,000 workloads and 200 teams: how long each page takes to become
// usable (its main content shown) in headless Chromium, printed, not asserted (speed is
// reported, never a pass/fail condition); what each page shows is checked against the API.

import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { ARTIFACTS, launchBrowser, startBerth } from "./berth.mjs";

const TEAMS = 200;
const WORKLOADS = 5000;
const SUBMITTERS = 8;

let berth;
let browser;
const timings = [];

/// Runs `job(i)` for i in 0..n, `SUBMITTERS` at a time.
async function parallel(n, job) {
  let next = 0;
  await Promise.all(
    Array.from({ length: SUBMITTERS }, async () => {
      while (next < n) await job(next++);
    }),
  );
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  // Seeding 5,000 workloads from one principal would hit the per-principal write limit.
  berth = await startBerth({
    BERTH_RATE_LIMIT_PER_SECOND: "0",
    BERTH_READ_RATE_LIMIT_PER_SECOND: "0",
    BERTH_TEAM_RATE_LIMIT_PER_SECOND: "0",
  });
  browser = await launchBrowser();
  const { call } = berth;
  for (const f of ["h100", "a100"]) await call("PUT", `/api/v1/flavors/${f}`, { spec: {} });
  for (const [name, flavor] of [["east", "h100"], ["west", "a100"]]) {
    await call("PUT", `/api/v1/clusters/${name}`, {
      spec: { kind: "sim", sim: { node_groups: [{ name: "g", count: 40, flavor, gpus_per_node: 8 }] } },
    });
  }
  // 10 departments of 19 teams each (200 in all), each team guaranteed 1 GPU of each flavor.
  const quotas = (n) => [
    { flavor: "h100", guaranteed: n },
    { flavor: "a100", guaranteed: n },
  ];
  const departments = Array.from({ length: 10 }, (_, d) => `dept-${d}`);
  for (const d of departments) await call("PUT", `/api/v1/teams/${d}`, { spec: { quotas: quotas(19) } });
  const teams = departments.flatMap((d, i) => Array.from({ length: 19 }, (_, j) => ({ name: `team-${i}-${j}`, parent: d })));
  await parallel(teams.length, (i) =>
    call("PUT", `/api/v1/teams/${teams[i].name}`, { spec: { parent: teams[i].parent, quotas: quotas(1) } }),
  );
  const started = Date.now();
  await parallel(WORKLOADS, (i) =>
    call("PUT", `/api/v1/teams/${teams[i % teams.length].name}/workloads/w-${i}`, {
      spec: {
        kind: i % 5 === 0 ? "batch" : "training",
        preemptible: true,
        tasks: { count: 1, resources: { flavors: [i % 2 ? "h100" : "a100"], gpus: 1 + (i % 4) } },
        sim: { duration_seconds: 86400 },
      },
    }),
  );
  console.log(`seeded ${TEAMS} teams and ${WORKLOADS} workloads in ${((Date.now() - started) / 1000).toFixed(1)} s`);
});

after(async () => {
  console.log("page usable after (ms):", JSON.stringify(Object.fromEntries(timings)));
  await browser?.close();
  await berth?.stop();
});

/// Opens `hash` signed in and records when `ready` (a locator on the page) showed, in the
/// page's own clock: milliseconds since the navigation started.
async function timePage(name, hash, ready) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.addInitScript((token) => sessionStorage.setItem("berth.session", JSON.stringify({ token })), berth.admin);
  await page.goto(berth.origin + "/" + hash);
  await ready(page).waitFor({ timeout: 30000 });
  const ms = Math.round(await page.evaluate(() => performance.now()));
  timings.push([name, ms]);
  console.log(`${name}: usable ${ms} ms after navigation started`);
  await page.screenshot({ path: join(ARTIFACTS, `scale-${name}.png`) });
  return page;
}

test("teams: all 200 in the tree", async () => {
  const page = await timePage("teams", "#/teams", (p) => p.locator('tr[data-team="team-9-18"]').first());
  assert.equal(await page.locator("tr[data-team] th[scope=row]").filter({ hasText: /\S/ }).count(), TEAMS);
  await page.close();
});

test("overview: phase counts add up to every workload", async () => {
  const since = new Date(Date.now() - 24 * 3600_000).toISOString();
  const report = `/api/v1/usage/report?from=${since}&group_by=team,flavor&bucket=hour`;
  const paths = ["/api/v1/clusters", "/api/v1/teams?limit=500", report, "/api/v1/workloads/summary", "/api/v1/queue"];
  for (const path of paths) {
    const started = Date.now();
    await berth.call("GET", path);
    console.log(`GET ${path}: ${Date.now() - started} ms`);
  }
  const page = await timePage("overview", "#/overview", (p) => p.locator('tr[data-phase="Pending"]'));
  const counts = await page.locator("tr[data-phase] td:nth-child(2)").allTextContents();
  assert.equal(counts.map(Number).reduce((a, b) => a + b, 0), WORKLOADS);
  // The chart at 200 teams: the 10 departments as seven layers and the rest as one, and
  // a department's 19 teams the same way.
  const layers = () => page.locator("section[aria-labelledby=chart-heading] li[data-layer]").evaluateAll((l) => l.map((e) => e.dataset.layer));
  await page.locator("section[aria-labelledby=chart-heading] li[data-layer]").first().waitFor();
  const departments = await layers();
  assert.equal(departments.length, 8, JSON.stringify(departments));
  assert.equal(departments[7], "3 other departments");
  const first = departments[0];
  await page.getByRole("button", { name: first, exact: true }).click();
  await page.getByRole("heading", { name: `GPUs in use by team under ${first}` }).waitFor();
  await page.waitForFunction(
    (d) => [...document.querySelectorAll("section[aria-labelledby=chart-heading] li[data-layer]")].every((l) => l.dataset.layer !== d),
    first,
  );
  // As many teams of it as hold GPUs of the flavor now (up to 19): seven and the rest as one.
  const teams = await layers();
  assert.ok(teams.length > 1 && teams.length <= 8, JSON.stringify(teams));
  assert.ok(teams.slice(0, 7).every((t) => t.startsWith(`team-${first.slice(5)}-`)), JSON.stringify(teams));
  if (teams.length === 8) assert.match(teams[7], /^\d+ other teams$/);
  await page.screenshot({ path: join(ARTIFACTS, "scale-overview-department.png") });
  await page.close();
});

test("queue: the head of the queue and the total", async () => {
  const page = await timePage("queue", "#/queue", (p) => p.locator("tr[data-workload]").first());
  const queue = await berth.call("GET", "/api/v1/queue?limit=1");
  assert.ok(queue.total > 100, `most of the 5,000 wait (${queue.total})`);
  assert.equal(await page.locator("tr[data-workload]").count(), 100);
  await page.close();
});

test("workloads: the first page", async () => {
  const page = await timePage("workloads", "#/workloads", (p) => p.locator("tr[data-workload]").first());
  assert.equal(await page.locator("tr[data-workload]").count(), 100);
  // The next page is the API's, and back again.
  const first = await berth.call("GET", "/api/v1/workloads?limit=100");
  const second = await berth.call("GET", `/api/v1/workloads?limit=100&cursor=${encodeURIComponent(first.next)}`);
  const key = (w) => `${w.metadata.team}/${w.metadata.name}`;
  const top = () => page.locator("tr[data-workload]").first().getAttribute("data-workload");
  await page.getByRole("button", { name: "Next page" }).click();
  await page.locator(`tr[data-workload="${key(second.items[0])}"]`).waitFor();
  assert.equal(await top(), key(second.items[0]));
  await page.getByRole("button", { name: "Previous page" }).click();
  await page.locator(`tr[data-workload="${key(first.items[0])}"]`).waitFor();
  assert.equal(await page.getByRole("button", { name: "Previous page" }).isDisabled(), true);
  await page.close();
});

test("clusters", async () => {
  const page = await timePage("clusters", "#/clusters", (p) => p.locator('section[data-cluster="west"] tr[data-flavor]'));
  await page.close();
});

test("audit: the newest hundred changes", async () => {
  const page = await timePage("audit", "#/audit", (p) => p.locator("tr[data-audit]").first());
  const newest = (await berth.call("GET", "/api/v1/audit?limit=1")).items[0];
  assert.equal(await page.locator("tr[data-audit]").count(), 100);
  assert.equal(await page.locator("tr[data-audit]").first().getAttribute("data-audit"), String(newest.id));
  await page.close();
});

test("a workload's detail", async () => {
  const page = await timePage("workload", "#/workload/team-0-0/w-0", (p) => p.locator('dd[data-fact="Phase"]'));
  await page.close();
});
