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
  await call("PUT", "/api/v1/teams/vision", { spec: { quotas: [{ flavor: "h100", guaranteed: 0 }] } });
  const workload = (gpus) => ({
    spec: { kind: "training", preemptible: true, tasks: { count: 1, resources: { flavors: ["h100"], gpus } }, sim: { duration_seconds: 3600 } },
  });
  for (const name of ["t1", "t2", "t3"]) await call("PUT", `/api/v1/teams/nlp/workloads/${name}`, workload(4));
  await call("PUT", "/api/v1/teams/vision/workloads/v1", workload(4));
  // The controllers admit all four: the 16 GPUs are held, nlp borrows 8, vision 4.
  await eventually(async () => {
    const c = await call("GET", "/api/v1/clusters/sim-a");
    return c.status.inventory[0]?.gpus_free === 0;
  });
  // nlp wants 4 more: it waits, being above its guarantee.
  await call("PUT", "/api/v1/teams/nlp/workloads/t4", workload(4));
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
  // Workloads by phase, and GPUs of the live ones, as the API counts them (read again until both agree: the
  // controllers keep working meanwhile).
  await eventually(async () => {
    const summary = await berth.call("GET", "/api/v1/workloads/summary");
    for (const p of summary.phases) {
      const cells = await page.locator(`tr[data-phase="${p.phase}"] td`).allTextContents();
      if (cells[1] !== String(p.workloads)) return false;
      // Finished work holds no GPUs: no sum is shown for it.
      const held = ["Succeeded", "Failed", "Cancelled"].includes(p.phase) ? "—" : String(Math.round(p.gpus * 100) / 100);
      if (cells[2] !== held) return false;
    }
    return true;
  });
  // nlp holds 12 with a guarantee of 4, vision 4 with none.
  await page.getByText("nlp: 8 h100 GPUs above its guarantee").waitFor();
  await page.getByText("vision: 4 h100 GPUs above its guarantee").waitFor();
  await page.screenshot({ path: join(ARTIFACTS, "overview.png"), fullPage: true });
  console.log(`overview usable ${usable} ms after sign-in`);
  await page.close();
});

test("an admin previews a quota change, sees the API's message next to a bad field, and saves", async () => {
  const page = await signedIn();
  await page.goto(berth.origin + "/#/teams");
  const nlp = page.locator('tr[data-team="nlp"][data-flavor="h100"]');
  await nlp.waitFor();
  const cells = await nlp.locator("td").allTextContents();
  assert.deepEqual(cells.slice(1, 6), ["4", "none", "1", "12", "8"]);
  assert.equal(cells[7], "over by 8");
  await page.getByRole("button", { name: "Edit quotas of nlp" }).click();
  const guaranteed = page.getByLabel("Guaranteed GPUs (h100)");
  const limit = page.getByLabel("Limit (GPUs) (h100)");
  // Not a whole number, or nothing: said beside the field, and nothing asked of the API
  // ("abc" went as null, an empty weight as 0).
  const asked = [];
  page.on("request", (r) => r.url().includes("/preview") && asked.push(r.url()));
  await guaranteed.fill("abc");
  await page.getByLabel("Weight (h100)").fill("");
  await page.getByRole("button", { name: "Preview" }).click();
  await page.locator("#q-0-guaranteed-error").filter({ hasText: "must be a whole number of GPUs" }).waitFor();
  await page.locator("#q-0-weight-error").filter({ hasText: "must be a whole number" }).waitFor();
  assert.deepEqual(asked, []);
  await page.getByLabel("Weight (h100)").fill("1");
  // A limit below the guarantee: the API's message shows beside the limit field.
  await guaranteed.fill("16");
  await limit.fill("6");
  await page.getByRole("button", { name: "Preview" }).click();
  const message = page.locator("#q-0-limit-error");
  await message.waitFor();
  assert.match(await message.textContent(), /limit/);
  assert.equal(await limit.getAttribute("aria-invalid"), "true");
  // Guaranteed 16, nlp could reclaim vision's borrowed 4 for t4: the preview says so, and
  // nothing is saved yet.
  await limit.fill("");
  await page.getByRole("button", { name: "Preview" }).click();
  const preview = page.getByRole("status", { name: "Preview" });
  await preview.getByText("1 workload would be preempted (4 GPUs: vision)").waitFor();
  await page.screenshot({ path: join(ARTIFACTS, "teams-preview.png"), fullPage: true });
  assert.equal((await berth.call("GET", "/api/v1/teams/nlp")).spec.quotas[0].guaranteed, 4);
  await page.getByRole("button", { name: "Save" }).click();
  await eventually(async () => (await nlp.locator("td").nth(1).textContent()) === "16");
  const saved = await berth.call("GET", "/api/v1/teams/nlp");
  assert.deepEqual(saved.spec.quotas, [{ flavor: "h100", guaranteed: 16, weight: 1 }]);
  await page.screenshot({ path: join(ARTIFACTS, "teams.png"), fullPage: true });
  await page.close();
});

test("a quota edit that another admin's change overtook is refused, not saved over it", async () => {
  const page = await signedIn();
  await page.goto(berth.origin + "/#/teams");
  const vision = page.locator('tr[data-team="vision"][data-flavor="h100"]');
  await vision.waitFor();
  await page.getByRole("button", { name: "Edit quotas of vision" }).click();
  await page.getByLabel("Guaranteed GPUs (h100)").fill("2");
  // Another admin sets a limit meanwhile, and the page's next refresh shows it: the editor
  // compared against the refreshed spec and saved over the limit.
  await berth.call("PUT", "/api/v1/teams/vision", { spec: { quotas: [{ flavor: "h100", guaranteed: 0, limit: 12 }] } });
  await eventually(async () => (await vision.locator("td").nth(2).textContent()) === "12");
  await page.getByRole("button", { name: "Save" }).click();
  await page.getByText("Someone else changed this since you opened it").waitFor();
  const kept = await berth.call("GET", "/api/v1/teams/vision");
  assert.deepEqual(kept.spec.quotas, [{ flavor: "h100", guaranteed: 0, limit: 12, weight: 1 }]);
  await page.close();
});

test("a viewer sees the teams but no edit controls", async () => {
  const page = await signedIn(berth.token("viewer"));
  await page.goto(berth.origin + "/#/teams");
  await page.locator('tr[data-team="nlp"]').first().waitFor();
  assert.equal(await page.getByRole("button", { name: /Edit quotas/ }).count(), 0);
  assert.equal(await page.getByRole("button", { name: /New team|Delete team/ }).count(), 0);
  await page.close();
});

test("the queue shows a pending workload's reason, as the API gives it", async () => {
  // The cluster is full: vision, guaranteed nothing, waits for 4 GPUs.
  await berth.call("PUT", "/api/v1/teams/vision/workloads/v2", {
    spec: { kind: "batch", tasks: { count: 1, resources: { flavors: ["h100"], gpus: 4 } }, sim: { duration_seconds: 60 } },
  });
  const v2 = await eventually(async () => {
    const w = await berth.call("GET", "/api/v1/teams/vision/workloads/v2");
    return w.status.pending_reason ? w : null;
  });
  const reason = v2.status.pending_reason.message;
  const page = await signedIn();
  await page.goto(berth.origin + "/#/queue");
  const row = page.locator('tr[data-workload="vision/v2"]');
  await row.locator("td.reason").filter({ hasText: reason }).waitFor();
  await page.screenshot({ path: join(ARTIFACTS, "queue.png"), fullPage: true });
  // Its detail page has the same reason and the event timeline.
  await row.getByRole("link").click();
  await page.locator('dd[data-fact="Why"]').filter({ hasText: reason }).waitFor();
  await page.getByRole("listitem").filter({ hasText: "Created" }).first().waitFor();
  await page.screenshot({ path: join(ARTIFACTS, "workload.png"), fullPage: true });
  await page.close();
});

test("a workload's page shows its owner, logs and estimate, and its owner cancels it keeping its history", async () => {
  const member = berth.token("member", "vision");
  const script = "#!/bin/bash\n#SBATCH --time=1:00:00\nsrun python train.py --epochs 'ten and two'\n";
  await berth.call("PUT", "/api/v1/teams/vision/workloads/mine", {
    spec: {
      kind: "batch",
      tasks: { count: 1, resources: { flavors: ["h100"], gpus: 4 } },
      run: { script, env: { EPOCHS: "12" } },
      sim: { duration_seconds: 60 },
    },
  }, member);
  // A running workload's page shows what its job printed.
  const page = await signedIn(member);
  // Its script reads as the lines it has, not one escaped string.
  await page.goto(berth.origin + "/#/workload/vision/mine");
  assert.equal(await page.getByTestId("script").textContent(), script);
  assert.equal(await page.getByTestId("env").textContent(), "EPOCHS12");
  await page.goto(berth.origin + "/#/workload/vision/v1");
  await page.getByTestId("logs").filter({ hasText: "[sim] task 0 of 1 started on" }).waitFor();
  // A teammate's workload (the admin submitted v1): a member may not cancel it, and sees no button.
  await page.locator('dd[data-fact="Owner"]').filter({ hasText: "platform-admin-user" }).waitFor();
  assert.equal(await page.getByRole("button", { name: "Cancel workload" }).count(), 0);
  // Its own pending workload: owner, the estimate (none: what holds the GPUs has no
  // runtime limit), and a Cancel button.
  await page.goto(berth.origin + "/#/workload/vision/mine");
  await page.locator('dd[data-fact="Owner"]').filter({ hasText: "member-user" }).waitFor();
  await page.locator('dd[data-fact="Estimated start"]').filter({ hasText: "not known" }).waitFor();
  page.once("dialog", (d) => d.accept());
  await page.getByRole("button", { name: "Cancel workload" }).click();
  await page.locator('dd[data-fact="Phase"]').filter({ hasText: "Cancelled" }).waitFor();
  await page.locator('dd[data-fact="Cancelled by"]').filter({ hasText: "member-user" }).waitFor();
  await page.getByRole("listitem").filter({ hasText: "Cancelled" }).first().waitFor();
  assert.equal(await page.getByRole("button", { name: "Cancel workload" }).count(), 0);
  const w = await berth.call("GET", "/api/v1/teams/vision/workloads/mine");
  assert.equal(w.status.phase, "Cancelled");
  assert.equal(w.metadata.owner.subject, "member-user");
  await page.screenshot({ path: join(ARTIFACTS, "workload-cancelled.png"), fullPage: true });
  // "Mine only" lists it, and nothing of the admin's.
  await page.goto(berth.origin + "/#/workloads");
  await page.getByLabel("Mine only").check();
  await eventually(async () => {
    const shown = await page.locator("tr[data-workload]").evaluateAll((rows) => rows.map((r) => r.dataset.workload));
    return JSON.stringify(shown) === JSON.stringify(["vision/mine"]);
  });
  await page.close();
});

test("the workloads table filters by phase through the API", async () => {
  const page = await signedIn();
  await page.goto(berth.origin + "/#/workloads");
  await page.locator("tr[data-workload]").first().waitFor();
  await page.getByLabel("Phase").selectOption("Running");
  const running = await berth.call("GET", "/api/v1/workloads?phase=Running");
  const expected = running.items.map((w) => `${w.metadata.team}/${w.metadata.name}`).sort();
  await eventually(async () => {
    const shown = await page.locator("tr[data-workload]").evaluateAll((rows) => rows.map((r) => r.dataset.workload));
    return JSON.stringify(shown.sort()) === JSON.stringify(expected);
  });
  await page.screenshot({ path: join(ARTIFACTS, "workloads.png"), fullPage: true });
  // The address keeps the filter: Back from a workload's page, or a reload, shows the
  // same rows (both reset it to all).
  assert.equal(new URL(page.url()).hash, "#/workloads?phase=Running");
  await page.locator("tr[data-workload] a").first().click();
  await page.waitForURL((u) => u.hash.startsWith("#/workload/"));
  await page.goBack();
  assert.equal(await page.getByLabel("Phase").inputValue(), "Running");
  await page.reload();
  assert.equal(await page.getByLabel("Phase").inputValue(), "Running");
  await page.close();
});

test("the workloads table searches names through the API and sorts by a column", async () => {
  const page = await signedIn();
  await page.goto(berth.origin + "/#/workloads");
  await page.locator("tr[data-workload]").first().waitFor();
  const shown = () => page.locator("tr[data-workload]").evaluateAll((rows) => rows.map((r) => r.dataset.workload));
  const shows = async (expected) => {
    await eventually(async () => JSON.stringify(await shown()) === JSON.stringify(expected));
  };
  // What the API lists (other tests add workloads to the shared fixture).
  const listed = async (query) =>
    (await berth.call("GET", `/api/v1/workloads${query}`)).items.map((w) => `${w.metadata.team}/${w.metadata.name}`);
  // Typed in capitals: names are lower case, and so is the search.
  await page.getByLabel("Name contains").fill("T");
  const withT = await listed("?name_contains=t");
  for (const w of ["nlp/t1", "nlp/t2", "nlp/t3", "nlp/t4"]) assert.ok(withT.includes(w), `${w} in ${withT}`);
  assert.ok(!withT.includes("vision/v1"));
  await shows(withT);
  await page.getByLabel("Name contains").fill("t3");
  await shows(await listed("?name_contains=t3"));
  await page.getByLabel("Name contains").fill("");
  const every = await listed("");
  await shows(every);
  // A heading sorts by its column, again the other way (ties keep the API's order).
  const name = page.getByRole("button", { name: "Name", exact: true });
  await name.click();
  await name.click();
  const byName = (w) => w.split("/")[1];
  const descending = [...every].sort((a, b) => (byName(a) < byName(b) ? 1 : byName(a) > byName(b) ? -1 : 0));
  assert.notDeepEqual(descending, every, "the sort moves rows");
  await shows(descending);
  assert.equal(await page.getByRole("columnheader", { name: /Name/ }).getAttribute("aria-sort"), "descending");
  // The waiting t4 has waited since it was submitted (and is still counting); a running one
  // waited until it started.
  const inQueue = (w) => page.locator(`tr[data-workload="${w}"] td`).nth(8).textContent();
  assert.match(await inQueue("nlp/t4"), /^\d+ (s|min)$/);
  const t1 = (await berth.call("GET", "/api/v1/teams/nlp/workloads/t1")).status;
  const waited = Math.round((Date.parse(t1.started_at) - Date.parse(t1.submitted_at)) / 1000);
  assert.ok(waited < 60, `t1 waited ${waited} s`);
  assert.equal(await inQueue("nlp/t1"), `${waited} s`);
  await page.close();
});

test("the audit page shows who changed what, filtered through the API, to admins and global viewers only", async () => {
  const page = await signedIn();
  await page.getByRole("link", { name: "Audit" }).click();
  await page.locator("tr[data-audit]").first().waitFor();
  await page.getByLabel("Kind").selectOption("workload");
  await page.getByLabel("Object name").fill("t1");
  // What is typed survives the page's refresh (every 5 s) until it is entered.
  await page.waitForResponse((r) => r.url().includes("/api/v1/audit?") && !r.url().includes("name="));
  await page.getByLabel("Object name").press("Enter");
  // The rows are the API's answer to the same filter, asked again on each try (others may
  // change a t1 meanwhile).
  let records = [];
  let shown = [];
  await eventually(
    async () => {
      shown = await page.locator("tr[data-audit]").evaluateAll((rows) => rows.map((r) => Number(r.dataset.audit)));
      records = (await berth.call("GET", "/api/v1/audit?kind=workload&name=t1")).items;
      return JSON.stringify(shown) === JSON.stringify(records.map((r) => r.id));
    },
    15000,
    () => `shown ${JSON.stringify(shown)}; the API: ${JSON.stringify(records)}`,
  );
  assert.ok(records.some((r) => r.verb === "create" && r.team === "nlp"), JSON.stringify(records));
  // Within the last hour: the same records; what is filtered is asked of the API.
  const asked = page.waitForRequest((r) => r.url().includes("/api/v1/audit?") && r.url().includes("since="));
  await page.getByLabel("Period").selectOption("last hour");
  const since = new URL((await asked).url()).searchParams.get("since");
  assert.ok(Math.abs(Date.parse(since) - (Date.now() - 3600_000)) < 60_000, since);
  await eventually(async () => (await page.locator("tr[data-audit]").count()) === records.length);
  const created = records.find((r) => r.verb === "create" && r.team === "nlp");
  const cells = await page.locator(`tr[data-audit="${created.id}"] td`).allTextContents();
  assert.deepEqual(cells.slice(1, 5), [created.actor, "create", "workload nlp/t1", "— → 1"]);
  await page.close();
  const viewer = await signedIn(berth.token("viewer"));
  await viewer.getByRole("link", { name: "Audit" }).waitFor();
  await viewer.close();
  const member = await signedIn(berth.token("member", "vision"));
  assert.equal(await member.getByRole("link", { name: "Audit" }).count(), 0);
  // Nor by its address: it showed the 403 and "Loading…" under it, and the access page
  // its forms, which then failed.
  for (const hash of ["#/audit", "#/access"]) {
    await member.goto(berth.origin + "/" + hash);
    await member.getByRole("alert").filter({ hasText: "not for your role" }).waitFor();
    assert.equal(await member.getByRole("button", { name: "Create account" }).count(), 0, hash);
  }
  await member.close();
});

test("a reload while Berth answers 503 keeps the session; only a refused token signs out", async () => {
  const page = await signedIn();
  // A database failover: the next /me answers 503.
  await page.route("**/api/v1/me", (route) =>
    route.fulfill({ status: 503, contentType: "application/problem+json", body: JSON.stringify({ title: "Service Unavailable", status: 503, detail: "database unreachable" }) }),
  );
  await page.reload();
  await page.getByRole("alert").filter({ hasText: "database unreachable" }).waitFor();
  assert.notEqual(await page.evaluate(() => sessionStorage.getItem("berth.session")), null, "the token was let go");
  await page.unroute("**/api/v1/me");
  await page.reload();
  await page.getByRole("navigation", { name: "Pages" }).waitFor();
  // A refused token is let go, with the API's reason, once (the provider's address
  // arriving asked again, without the token).
  const asked = [];
  page.on("request", (r) => r.url().endsWith("/api/v1/me") && asked.push(r.headers().authorization ?? "none"));
  await page.evaluate(() => sessionStorage.setItem("berth.session", JSON.stringify({ token: "not-a-token" })));
  await page.reload();
  await page.getByLabel("Access token").waitFor();
  assert.deepEqual(asked, ["Bearer not-a-token"]);
  assert.equal(await page.evaluate(() => sessionStorage.getItem("berth.session")), null);
  await page.close();
});

test("a team admin creates a sub-team and gives it a flavor quota; the audit page shows that change before and after", async () => {
  const teamAdmin = berth.token("team-admin", "nlp");
  const page = await signedIn(teamAdmin);
  page.on("dialog", (d) => d.accept());
  await page.getByRole("link", { name: "Teams" }).click();
  await page.getByRole("button", { name: "New team" }).click();
  // Only under nlp (the team it administers): no department of its own.
  const under = await page.getByLabel("Under").locator("option").allTextContents();
  assert.deepEqual(under, ["nlp"]);
  // A bad name: the API's message beside the field, nothing created.
  await page.getByLabel("Name", { exact: true }).fill("Speech_Team");
  await page.getByRole("button", { name: "Create" }).click();
  const nameError = page.locator("#new-team-name-error");
  await nameError.waitFor();
  const create = async (name) =>
    (
      await fetch(`${berth.origin}/api/v1/teams/${name}`, {
        method: "PUT",
        headers: { Authorization: `Bearer ${teamAdmin}`, "Content-Type": "application/json", "If-None-Match": "*" },
        body: JSON.stringify({ spec: { parent: "nlp" } }),
      })
    ).json();
  const problem = await create("Speech_Team");
  assert.equal(await nameError.textContent(), problem.errors.find((e) => e.field === "/metadata/name").message);
  // A team outside its tree (vision) is not its to see: what the API says, beside the name.
  await page.getByLabel("Name", { exact: true }).fill("vision");
  await page.getByRole("button", { name: "Create" }).click();
  const hidden = await create("vision");
  await nameError.filter({ hasText: hidden.detail }).waitFor();
  assert.equal((await berth.call("GET", "/api/v1/teams/vision")).spec.parent ?? null, null, "vision is untouched");
  // The good name: created under nlp, and its quotas open for editing.
  await page.getByLabel("Name", { exact: true }).fill("speech");
  await page.getByRole("button", { name: "Create" }).click();
  await page.getByRole("heading", { name: "Quotas of speech" }).waitFor();
  assert.equal((await berth.call("GET", "/api/v1/teams/speech")).spec.parent, "nlp");
  await page.getByLabel("Add a quota for").selectOption("h100");
  await page.getByLabel("Guaranteed GPUs (h100)").fill("2");
  await page.getByLabel("Limit (GPUs)").fill("4");
  await page.getByRole("button", { name: "Save" }).click();
  await page.locator('tr[data-team="speech"][data-flavor="h100"]').waitFor();
  const speech = await berth.call("GET", "/api/v1/teams/speech");
  assert.deepEqual(speech.spec.quotas, [{ flavor: "h100", guaranteed: 2, limit: 4, weight: 1 }]);
  // Creating it again does not replace it.
  await page.getByRole("button", { name: "New team" }).click();
  await page.getByLabel("Name", { exact: true }).fill("speech");
  await page.getByRole("button", { name: "Create" }).click();
  await nameError.filter({ hasText: "a team named speech exists" }).waitFor();
  assert.equal((await berth.call("GET", "/api/v1/teams/speech")).metadata.generation, speech.metadata.generation);
  await page.close();

  // The audit page (a platform admin's) shows the update with what it changed.
  const admin = await signedIn();
  await admin.getByRole("link", { name: "Audit" }).click();
  await admin.getByLabel("Object name").fill("speech");
  await admin.getByLabel("Object name").press("Enter");
  const records = (await berth.call("GET", "/api/v1/audit?kind=team&name=speech")).items;
  assert.deepEqual(records.map((r) => [r.verb, r.actor]), [["update", "team-admin-user"], ["create", "team-admin-user"]]);
  const update = admin.locator(`tr[data-audit="${records[0].id}"]`);
  await update.locator("summary").click();
  const rows = await update.locator("table.diff tbody tr").evaluateAll((trs) =>
    trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent)),
  );
  assert.deepEqual(records[0].spec_before.quotas ?? [], []);
  assert.deepEqual(records[0].spec_after.quotas, speech.spec.quotas);
  for (const [field, after] of [["quotas/0/flavor", '"h100"'], ["quotas/0/guaranteed", "2"], ["quotas/0/limit", "4"]])
    assert.ok(rows.some(([f, b, a]) => f === field && b === "—" && a === after), `${field} in ${JSON.stringify(rows)}`);
  await admin.close();

  // And the team admin deletes the sub-team again.
  const again = await signedIn(berth.token("team-admin", "nlp"));
  again.on("dialog", (d) => d.accept());
  await again.getByRole("link", { name: "Teams" }).click();
  await again.getByRole("button", { name: "Delete team speech" }).waitFor();
  // Its version moves after the page read it, its spec the same (as Berth's own status
  // writes move it): the delete is asked again with the new version, not refused with
  // "If-Match does not match".
  const before = await berth.call("GET", "/api/v1/teams/speech");
  await berth.call("PUT", "/api/v1/teams/speech", { metadata: { labels: { moved: "yes" } }, spec: before.spec });
  await again.getByRole("button", { name: "Delete team speech" }).click();
  await eventually(async () => (await again.locator('tr[data-team="speech"]').count()) === 0);
  assert.equal((await fetch(`${berth.origin}/api/v1/teams/speech`, { headers: { Authorization: `Bearer ${berth.admin}` } })).status, 404);
  // It cannot delete the team it administers: no button there.
  assert.equal(await again.getByRole("button", { name: "Delete team nlp" }).count(), 0);
  await again.close();
});

test("an admin cordons and uncordons a cluster; a viewer has no such button", async () => {
  const page = await signedIn();
  await page.goto(berth.origin + "/#/clusters");
  // One node group (h100, no block): 2 nodes, 16 GPUs, as many placed by Berth as its
  // nodes endpoint says.
  const nodes = (await berth.call("GET", "/api/v1/clusters/sim-a/nodes")).items;
  const placed = nodes.reduce((a, n) => a + n.allocated_gpus, 0);
  const group = page.locator('section[data-cluster="sim-a"] tr[data-group="h100/—"] td');
  await group.first().waitFor();
  assert.deepEqual((await group.allTextContents()).slice(2, 4), ["2 (2)", "16"]);
  assert.ok(placed > 0);
  await page.getByRole("button", { name: "Cordon sim-a", exact: true }).click();
  await page.getByRole("button", { name: "Uncordon sim-a", exact: true }).waitFor();
  assert.equal((await berth.call("GET", "/api/v1/clusters/sim-a")).spec.cordoned, true);
  await page.screenshot({ path: join(ARTIFACTS, "clusters.png"), fullPage: true });
  await page.getByRole("button", { name: "Uncordon sim-a", exact: true }).click();
  await page.getByRole("button", { name: "Cordon sim-a", exact: true }).waitFor();
  assert.equal((await berth.call("GET", "/api/v1/clusters/sim-a")).spec.cordoned, false);
  await page.close();
  const viewer = await signedIn(berth.token("viewer"));
  await viewer.goto(berth.origin + "/#/clusters");
  await viewer.locator('section[data-cluster="sim-a"]').waitFor();
  assert.equal(await viewer.getByRole("button", { name: /Cordon/ }).count(), 0);
  await viewer.close();
});

test("on a narrow screen every page fits its width", async () => {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await page.addInitScript((token) => sessionStorage.setItem("berth.session", JSON.stringify({ token })), berth.admin);
  for (const [hash, ready] of [
    ["#/overview", 'tr[data-phase="Pending"]'],
    ["#/teams", 'tr[data-team="nlp"]'],
    ["#/queue", "h1"],
    ["#/workloads", "tr[data-workload]"],
    ["#/clusters", 'section[data-cluster="sim-a"]'],
    ["#/audit", "tr[data-audit]"],
    ["#/access", "#grant-heading"],
    ["#/workload/vision/mine", "[data-testid=script]"],
  ]) {
    await page.goto(berth.origin + "/" + hash);
    await page.locator(ready).first().waitFor();
    await page.screenshot({ path: join(ARTIFACTS, `narrow-${hash.slice(2).replaceAll("/", "-")}.png`), fullPage: true });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    const wide = await page.evaluate(() =>
      [...document.querySelectorAll("body *")]
        .filter((e) => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
        .slice(0, 3)
        .map((e) => e.tagName + "." + e.className),
    );
    assert.ok(overflow <= 0, `${hash} is ${overflow} px wider than the screen: ${wide}`);
  }
  await page.close();
});

test("the overview's chart shows GPUs in use per department, one flavor at a time, and drills down to the teams below", async () => {
  // A second flavor on a cluster of its own, used by a team below nlp.
  await berth.call("PUT", "/api/v1/flavors/a100", { spec: {} });
  await berth.call("PUT", "/api/v1/clusters/sim-b", {
    spec: { kind: "sim", sim: { node_groups: [{ name: "g", count: 1, flavor: "a100", gpus_per_node: 8 }] } },
  });
  const nlp = await berth.call("GET", "/api/v1/teams/nlp");
  await berth.call("PUT", "/api/v1/teams/nlp", { spec: { ...nlp.spec, quotas: [...nlp.spec.quotas, { flavor: "a100", guaranteed: 4 }] } });
  await berth.call("PUT", "/api/v1/teams/asr", { spec: { parent: "nlp", quotas: [{ flavor: "a100", guaranteed: 2 }] } });
  await berth.call("PUT", "/api/v1/teams/asr/workloads/a1", {
    spec: { kind: "training", tasks: { count: 1, resources: { flavors: ["a100"], gpus: 2 } }, sim: { duration_seconds: 3600 } },
  });
  await eventually(async () => (await berth.call("GET", "/api/v1/teams/asr/workloads/a1")).status.phase === "Running");
  // What the API reports for the last hour, in average GPUs per layer.
  const averages = async (flavor, layer) => {
    const to = new Date();
    const from = new Date(to - 3600_000);
    const q = `from=${from.toISOString()}&to=${to.toISOString()}&group_by=team,flavor&bucket=minute`;
    const report = await berth.call("GET", `/api/v1/usage/report?${q}`);
    const parents = new Map(report.teams.map((t) => [t.team, t.parent ?? null]));
    const sums = new Map();
    for (const r of report.rows.filter((r) => r.flavor === flavor)) {
      const name = layer(r.team, parents);
      if (name) sums.set(name, (sums.get(name) ?? 0) + r.gpu_hours);
    }
    return new Map([...sums].filter(([, v]) => v > 0));
  };
  const top = (team, parents) => {
    while (parents.get(team)) team = parents.get(team);
    return team;
  };
  const shown = async (page) =>
    new Map(
      await page.locator("section[aria-labelledby=chart-heading] li[data-layer]").evaluateAll((lis) =>
        lis.map((li) => [li.dataset.layer, Number(li.querySelector(".muted").textContent)]),
      ),
    );
  const same = (a, b) => a.size === b.size && [...a].every(([k, v]) => b.has(k) && Math.abs(b.get(k) - v) <= 0.05);
  const page = await signedIn();
  const chart = page.locator("section[aria-labelledby=chart-heading]");
  await chart.getByLabel("Period").selectOption("last hour");
  // a100 first (by name): all of it is nlp's, through asr.
  await eventually(async () => (await chart.getByLabel("Flavor").locator("option").allTextContents()).join() === "a100,h100");
  let expected = new Map();
  let seen = new Map();
  const matches = (flavor, layer) =>
    eventually(
      async () => {
        [expected, seen] = [await averages(flavor, layer), await shown(page)];
        return expected.size > 0 && same(expected, seen);
      },
      15000,
      () => `page ${JSON.stringify([...seen])}; API ${JSON.stringify([...expected])}`,
    );
  await matches("a100", top);
  assert.deepEqual([...seen.keys()], ["nlp"]);
  // h100: both departments.
  await chart.getByLabel("Flavor").selectOption("h100");
  await matches("h100", top);
  assert.deepEqual([...seen.keys()].sort(), ["nlp", "vision"]);
  // nlp has a team below it: a button that drills down; vision has none.
  assert.equal(await page.getByRole("button", { name: "vision", exact: true }).count(), 0);
  await page.getByRole("button", { name: "nlp", exact: true }).click();
  await page.getByRole("heading", { name: "GPUs in use by team under nlp" }).waitFor();
  const below = (team, parents) => (team === "nlp" ? "nlp (its own work)" : parents.get(team) === "nlp" ? team : null);
  await matches("h100", below);
  assert.deepEqual([...seen.keys()], ["nlp (its own work)"]);
  await chart.getByLabel("Flavor").selectOption("a100");
  await matches("a100", below);
  assert.deepEqual([...seen.keys()], ["asr"]);
  await page.getByRole("button", { name: "All departments" }).click();
  await page.getByRole("heading", { name: "GPUs in use by department" }).waitFor();
  // Every period up to 90 days draws from the report.
  for (const period of ["last 24 hours", "last 7 days", "last 30 days", "last 90 days"]) {
    const asked = page.waitForResponse((r) => r.url().includes("/api/v1/usage/report?"));
    await chart.getByLabel("Period").selectOption(period);
    assert.equal((await asked).status(), 200, period);
    await page.locator("section[aria-labelledby=chart-heading] li[data-layer=nlp]").waitFor();
  }
  await page.close();
});

test("a team admin grants and revokes a role in its subtree, and gives a service account a token shown once", async () => {
  const page = await signedIn(berth.token("team-admin", "nlp"));
  page.on("dialog", (d) => d.accept());
  await page.getByRole("link", { name: "Access" }).click();
  await page.getByRole("heading", { name: "Grant a role" }).waitFor();
  // Its scope: nlp and the teams below it, never vision.
  const teams = await page.getByLabel("On team").locator("option").allTextContents();
  assert.ok(teams[0] === "nlp" && !teams.includes("vision"), JSON.stringify(teams));
  assert.ok(!(await page.getByLabel("Role").locator("option").allTextContents()).includes("platform-admin"));
  // A subject that is only blanks: the API's message beside the field.
  await page.getByLabel("Subject").fill("   ");
  await page.getByRole("button", { name: "Grant" }).click();
  await page.locator("#grant-subject-error").waitFor();
  await page.getByLabel("Subject").fill("bob");
  await page.getByRole("button", { name: "Grant" }).click();
  const bound = async () => (await berth.call("GET", "/api/v1/role-bindings?subject=bob")).items;
  await eventually(async () => (await bound()).length === 1);
  const [binding] = await bound();
  assert.deepEqual([binding.role, binding.team, binding.created_by], ["member", "nlp", "team-admin-user"]);
  await page.locator(`tr[data-binding="${binding.id}"]`).waitFor();
  await page.getByRole("button", { name: "Revoke member of bob on nlp" }).click();
  await eventually(async () => (await bound()).length === 0);
  await eventually(async () => (await page.locator(`tr[data-binding="${binding.id}"]`).count()) === 0);

  // A service account of nlp, a role for it, and a token that works until revoked.
  await page.getByLabel("Account name").fill("ci-bot");
  await page.getByRole("button", { name: "Create account" }).click();
  await page.locator('article[data-account="ci-bot"]').waitFor();
  await page.getByLabel("Subject").fill("serviceaccount:ci-bot");
  await page.getByRole("button", { name: "Grant" }).click();
  await eventually(async () => (await berth.call("GET", "/api/v1/role-bindings?subject=serviceaccount:ci-bot")).items.length === 1);
  await page.getByLabel("Lifetime of a new token for ci-bot").selectOption("1 day");
  await page.getByRole("button", { name: "New token for ci-bot" }).click();
  const token = await page.getByLabel("Token for ci-bot", { exact: true }).inputValue();
  const me = (t) => fetch(`${berth.origin}/api/v1/me`, { headers: { Authorization: `Bearer ${t}` } });
  const who = await me(token);
  const body = await who.text();
  assert.equal(JSON.parse(body).subject, "serviceaccount:ci-bot", `${who.status} ${body}`);
  const [record] = (await berth.call("GET", "/api/v1/service-accounts/ci-bot/tokens")).items;
  const lifetime = Date.parse(record.expires_at) - Date.parse(record.created_at);
  assert.ok(Math.abs(lifetime - 86_400_000) < 5000, `lives ${lifetime} ms`);
  // Shown once: gone after a reload, from the page and from what it fetched.
  await page.reload();
  await page.locator(`tr[data-token="${record.id}"]`).waitFor();
  assert.ok(!(await page.content()).includes(token));
  await page.getByRole("button", { name: /Revoke token of ci-bot/ }).click();
  await eventually(async () => (await me(token)).status === 401);
  await page.close();
  // A member manages no access: no such page.
  const member = await signedIn(berth.token("member", "nlp"));
  assert.equal(await member.getByRole("link", { name: "Access" }).count(), 0);
  await member.close();
});
