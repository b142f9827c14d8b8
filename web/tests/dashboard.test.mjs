// The dashboard in a real headless Chromium against a real berthd, Postgres and simulated
// clusters. Screenshots of each page go to web/test-results/.

import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { ARTIFACTS, eventually, launchBrowser, startBerth } from "./berth.mjs";

let berth;
let browser;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  berth = await startBerth();
  browser = await launchBrowser();
  const { call } = berth;
  await call("PUT", "/api/v1/flavors/h100", { spec: {} });
  await call("PUT", "/api/v1/clusters/sim-a", {
    spec: { kind: "sim", sim: { node_groups: [{ name: "g", count: 2, flavor: "h100", gpus_per_node: 8 }] } },
  });
  await call("PUT", "/api/v1/teams/nlp", { spec: { quotas: [{ flavor: "h100", guaranteed: 4 }] } });
  for (const name of ["t1", "t2", "t3"]) {
    await call("PUT", `/api/v1/teams/nlp/workloads/${name}`, {
      spec: { kind: "training", tasks: { count: 1, resources: { flavors: ["h100"], gpus: 4 } }, sim: { duration_seconds: 3600 } },
    });
  }
  // The controllers admit all three: 12 of 16 GPUs held.
  await eventually(async () => {
    const c = await call("GET", "/api/v1/clusters/sim-a");
    return c.status.inventory[0]?.gpus_free === 4;
  });
});

after(async () => {
  await browser?.close();
  await berth?.stop();
});

async function signedIn(token = berth.admin) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(berth.origin + "/");
  await page.getByLabel("Access token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("navigation", { name: "Pages" }).waitFor();
  return page;
}

test("a bad token is refused and a good one signs in", async () => {
  const page = await browser.newPage();
  await page.goto(berth.origin + "/");
  await page.getByLabel("Access token").fill("not-a-token");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").filter({ hasText: "not valid" }).waitFor();
  await page.getByLabel("Access token").fill(berth.admin);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByText("platform-admin-user").waitFor();
  await page.close();
});

test("the overview's numbers are the API's", async () => {
  const page = await signedIn();
  const started = Date.now();
  await page.getByRole("heading", { name: "Clusters" }).waitFor();
  const usable = Date.now() - started;
  const cluster = await berth.call("GET", "/api/v1/clusters/sim-a");
  const inv = cluster.status.inventory.find((i) => i.flavor === "h100");
  const row = page.locator('tr[data-cluster="sim-a"][data-flavor="h100"]');
  const cells = await row.locator("td").allTextContents();
  assert.deepEqual(cells.slice(3), ["h100", String(inv.gpus_total), String(inv.gpus_total - inv.gpus_free), String(inv.gpus_free)]);
  assert.equal(await page.getByTestId("allocated-h100").textContent(), String(inv.gpus_total - inv.gpus_free));
  // nlp holds 12 with a guarantee of 4.
  await page.getByText("nlp: 8 h100 GPUs above its guarantee").waitFor();
  await page.screenshot({ path: join(ARTIFACTS, "overview.png"), fullPage: true });
  console.log(`overview usable ${usable} ms after sign-in`);
  await page.close();
});
