// The Reports page and the Teams page's monthly totals against a real berthd, over usage
// seeded straight into the accounting ledger of a fixed past week (the API writes the
// ledger only when real work ends). Screenshots go to web/test-results/.

import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { ARTIFACTS, eventually, launchBrowser, psql, startBerth } from "./berth.mjs";

let berth;
let browser;

// The week of Monday 2 November 2026 (UTC days, both ends included), at 2.5 per h100
// GPU-hour. research is a department; nlp and vision are its teams.
const FROM = "2026-11-02";
const TO = "2026-11-08";
const PERIOD = "from=2026-11-02T00:00:00Z&to=2026-11-09T00:00:00Z";
const RECORDS = [
  // team, owner, GPUs, borrowed, start, end, price
  ["nlp", "alice", 4, false, "2026-11-02T10:00Z", "2026-11-02T16:00Z", 2.5], // 24
  ["nlp", "bob", 2, false, "2026-11-03T22:00Z", "2026-11-04T04:00Z", 2.5], // 12: 4 on the 3rd, 8 on the 4th
  ["nlp", "alice", 8, true, "2026-11-05T08:00Z", "2026-11-05T11:30Z", 2.5], // 28, admitted borrowed: 8 against nlp's 4, so 14 borrowed
  ["vision", "carol", 1, false, "2026-11-06T00:00Z", "2026-11-07T12:00Z", 2.5], // 36
  ["vision", "carol", 2, false, "2026-11-08T20:00Z", "2026-11-09T04:00Z", 2.5], // 8 within the period
  ["research", "dave", 1, false, "2026-11-07T06:00Z", "2026-11-07T08:00Z", null], // 2, no price then
  ["nlp", "alice", 4, false, "2026-10-20T00:00Z", "2026-10-20T10:00Z", 2.5], // before the period
];
// By hand.
const TOTALS = { gpu_hours: 110, in_quota_gpu_hours: 96, borrowed_gpu_hours: 14, cost: 270 };
const OWNERS = { "nlp/alice": [52, 130], "nlp/bob": [12, 30], "vision/carol": [44, 110], "research/dave": [2, 0] };
const TEAMS = { research: [110, 270], nlp: [64, 160], vision: [44, 110] };

const ANCESTORS = { research: ["research"], nlp: ["nlp", "research"], vision: ["vision", "research"] };

/// The page's way of writing GPU-hours and costs.
const hours = (x) => x.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
const money = (x) => x.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
const close = (a, b) => Math.abs(a - b) < 1e-6;

function ledger(team, owner, gpus, borrowed, start, end, price, attempt = 1) {
  const teams = `ARRAY[${ANCESTORS[team].map((t) => `'${t}'`).join(",")}]`;
  // The teams' uids, as the controllers record them beside the names.
  const uids = `ARRAY(SELECT t.uid FROM unnest(${teams}) WITH ORDINALITY AS n (name, i) JOIN teams t ON t.name = n.name ORDER BY n.i)`;
  return `INSERT INTO usage_ledger (workload_uid, attempt, team, teams, team_uids, workload, owner, flavor, cluster, backend,
      kind, gpus, borrowed, started_at, ended_at, outcome, price)
    VALUES (gen_random_uuid(), ${attempt}, '${team}', ${teams}, ${uids}, '${owner}-job', '${owner}', 'h100', 'sim-a', 'sim',
      'training', ${gpus}, ${borrowed}, ${start}, ${end}, 'succeeded', ${price ?? "NULL"})`;
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  berth = await startBerth();
  browser = await launchBrowser();
  const { call } = berth;
  await call("PUT", "/api/v1/flavors/h100", { spec: { price: { per_gpu_hour: 2.5 } } });
  await call("PUT", "/api/v1/teams/research", { spec: { quotas: [{ flavor: "h100", guaranteed: 8 }] } });
  await call("PUT", "/api/v1/teams/nlp", {
    spec: {
      parent: "research",
      quotas: [{ flavor: "h100", guaranteed: 4 }],
      budgets: [{ gpu_hours: 100, period: "month", action: "warn" }],
    },
  });
  await call("PUT", "/api/v1/teams/vision", { spec: { parent: "research", quotas: [{ flavor: "h100", guaranteed: 2 }] } });
  for (const [team, owner, gpus, borrowed, start, end, price] of RECORDS)
    psql(berth.database, ledger(team, owner, gpus, borrowed, `'${start}'`, `'${end}'`, price));
  // Today: nlp's erin, 45 GPUs for up to 2 hours ending now (never before the 1st), so that
  // this month (whichever it is) has usage: against nlp's monthly budget, and in the Teams
  // page's monthly totals.
  const monthStart = "date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'";
  psql(berth.database, ledger("nlp", "erin", 45, true, `greatest(now() - interval '2 hours', ${monthStart})`, "now()", 2.5));
});

after(async () => {
  await browser?.close();
  await berth?.stop();
});

async function signedIn(token = berth.admin, viewport = { width: 1280, height: 900 }) {
  const page = await browser.newPage({ viewport });
  await page.addInitScript((t) => sessionStorage.setItem("berth.session", JSON.stringify({ token: t })), token);
  return page;
}

/// The Reports page showing the seeded week, per day.
async function seededWeek(page) {
  await page.goto(berth.origin + "/#/reports");
  await page.getByRole("navigation", { name: "Pages" }).getByRole("link", { name: "Reports" }).waitFor();
  await page.getByLabel("From", { exact: true }).fill(FROM);
  await page.getByLabel("To", { exact: true }).fill(TO);
  await page.getByLabel("Per", { exact: true }).selectOption("day");
}

test("the API's report of the seeded week is the one computed by hand", async () => {
  const r = await berth.call("GET", `/api/v1/usage/report?${PERIOD}&group_by=team,owner`);
  for (const [k, v] of Object.entries(TOTALS)) assert.ok(close(r.totals[k], v), `${k}: ${r.totals[k]}, not ${v}`);
  for (const [key, [h, cost]] of Object.entries(OWNERS)) {
    const [team, owner] = key.split("/");
    const row = r.rows.find((x) => x.team === team && x.owner === owner);
    assert.ok(row && close(row.gpu_hours, h) && close(row.cost, cost), `${key}: ${JSON.stringify(row)}`);
  }
  for (const [team, [h, cost]] of Object.entries(TEAMS)) {
    const t = r.teams.find((x) => x.team === team);
    assert.ok(t && close(t.subtree.gpu_hours, h) && close(t.subtree.cost, cost), `${team}: ${JSON.stringify(t)}`);
  }
  assert.equal(r.teams.find((x) => x.team === "nlp").parent, "research");
  // research held 8 then, its own guarantee: nlp's borrowing was within it.
  const borrowed = (team) => r.teams.find((x) => x.team === team).subtree.borrowed_gpu_hours;
  assert.ok(close(borrowed("nlp"), 14) && close(borrowed("research"), 0), JSON.stringify(r.teams));
  assert.ok(!r.teams.find((x) => x.team === "research").parent);
  // bob's run crosses midnight: 4 GPU-hours on the 3rd, 8 on the 4th.
  const daily = await berth.call("GET", `/api/v1/usage/report?${PERIOD}&group_by=team&bucket=day`);
  const nlpOn = (day) => daily.rows.find((x) => x.team === "nlp" && x.bucket.startsWith(day))?.gpu_hours;
  assert.ok(close(nlpOn("2026-11-03"), 4) && close(nlpOn("2026-11-04"), 8), JSON.stringify(daily.rows));
});

test("the Reports page shows the API's totals, teams, owners and chart, and downloads the period as CSV", async () => {
  // Berth works out nlp's budget use (erin's run) first.
  const budget = await eventually(async () => {
    const b = (await berth.call("GET", "/api/v1/teams/nlp")).status.budgets?.[0];
    return b?.used_gpu_hours > 0 ? b : null;
  }, 60000);
  const page = await signedIn();
  await seededWeek(page);
  const api = await berth.call("GET", `/api/v1/usage/report?${PERIOD}&group_by=team,owner`);
  const total = page.getByTestId("report-total-gpu-hours");
  await eventually(async () => (await total.textContent()) === hours(api.totals.gpu_hours));
  assert.equal(await total.textContent(), hours(TOTALS.gpu_hours));
  assert.equal(await page.getByTestId("report-total-cost").textContent(), money(api.totals.cost));
  assert.equal(await page.getByTestId("report-total-cost").textContent(), money(TOTALS.cost));
  // dave's 2 GPU-hours had no price: the cost says it leaves them out.
  assert.ok(await page.getByText("not 2.0 of flavors without one").isVisible(), "the cost names its unpriced GPU-hours");
  assert.equal(await page.getByTestId("report-total-in-quota-gpu-hours").textContent(), hours(TOTALS.in_quota_gpu_hours));
  assert.equal(await page.getByTestId("report-total-borrowed-gpu-hours").textContent(), hours(TOTALS.borrowed_gpu_hours));
  // The address keeps the period.
  assert.match(page.url(), /#\/reports\?from=2026-11-02&to=2026-11-08&bucket=day$/);

  // Department, teams (subtree totals), owners under their team.
  // research's and dave's costs leave out dave's unpriced hours, and are marked so.
  for (const [team, [h, cost]] of Object.entries(TEAMS)) {
    const cells = await page.locator(`tr[data-team="${team}"] td`).allTextContents();
    assert.deepEqual(cells.slice(0, 2), [hours(h), money(cost) + (team === "research" ? "*" : "")], team);
  }
  assert.equal(
    await page.locator('tr[data-team="research"] td span[title]').getAttribute("title"),
    "not counting 2.0 GPU-hours of flavors without a price",
  );
  assert.match(await page.locator('tr[data-team="research"] th').textContent(), /own 2\.0/);
  for (const [key, [h, cost]] of Object.entries(OWNERS)) {
    const cells = await page.locator(`tr[data-owner="${key}"] td`).allTextContents();
    assert.deepEqual(cells.slice(0, 3), [key.split("/")[1], hours(h), money(cost) + (key === "research/dave" ? "*" : "")], key);
  }
  const order = await page.locator("table.report tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.team ?? r.dataset.owner));
  assert.deepEqual(order, ["research", "research/dave", "nlp", "nlp/alice", "nlp/bob", "vision", "vision/carol"]);

  // The chart: a layer per team, largest first in the legend.
  for (const team of ["nlp", "vision", "research"]) await page.locator(`.chart path[data-layer="${team}"]`).waitFor();
  assert.deepEqual(await page.locator(".legend li").evaluateAll((l) => l.map((e) => e.dataset.layer)), ["nlp", "vision", "research"]);

  // Top consumers.
  const top = await page.locator("tr[data-consumer]").evaluateAll((rows) => rows.map((r) => r.dataset.consumer));
  assert.deepEqual(top, ["alice", "carol", "bob", "dave"]);

  // nlp's budget: this month's use, as the API has it.
  const bar = page.locator('li[data-budget="nlp/0"]');
  await bar.getByTestId("budget-used").filter({ hasText: hours(budget.used_gpu_hours) }).waitFor();
  assert.equal(await bar.getAttribute("data-state"), budget.state);
  assert.match(await bar.textContent(), /of 100\.0 GPU-hours.*action: warn/);

  await page.screenshot({ path: join(ARTIFACTS, "reports.png"), fullPage: true });

  // The CSV of the period, per day, by team and owner: its GPU-hours add up to the total.
  const [download] = await Promise.all([page.waitForEvent("download"), page.getByRole("button", { name: "Download CSV" }).click()]);
  assert.equal(download.suggestedFilename(), `berth-usage-${FROM}-${TO}.csv`);
  const lines = readFileSync(await download.path(), "utf8").trim().split(/\r?\n/);
  const header = lines[0].split(",");
  assert.deepEqual(header, ["bucket", "team", "owner", "gpu_hours", "in_quota_gpu_hours", "borrowed_gpu_hours", "cost", "unpriced_gpu_hours"]);
  const rows = lines.slice(1).map((l) => Object.fromEntries(l.split(",").map((v, i) => [header[i], v])));
  const sum = (k) => rows.reduce((a, r) => a + Number(r[k]), 0);
  assert.ok(Math.abs(sum("gpu_hours") - TOTALS.gpu_hours) < 1e-4, `CSV GPU-hours add up to ${sum("gpu_hours")}`);
  assert.ok(Math.abs(sum("cost") - TOTALS.cost) < 1e-4, `CSV cost adds up to ${sum("cost")}`);
  assert.equal(sum("unpriced_gpu_hours"), 2, "dave's 2, without a price then");
  assert.ok(rows.every((r) => r.bucket >= "2026-11-02" && r.bucket < "2026-11-09"), JSON.stringify(rows));
  // bob's two days.
  assert.deepEqual(
    rows.filter((r) => r.owner === "bob").map((r) => [r.bucket.slice(0, 10), Number(r.gpu_hours)]),
    [["2026-11-03", 4], ["2026-11-04", 8]],
  );
  await page.close();
});

test("a preset changes the period, and the totals follow the API's", async () => {
  const page = await signedIn();
  await seededWeek(page);
  await page.getByTestId("report-total-gpu-hours").filter({ hasText: hours(TOTALS.gpu_hours) }).waitFor();
  await page.getByRole("button", { name: "Last 7 days" }).click();
  const today = new Date().toISOString().slice(0, 10);
  const from = new Date(Date.parse(`${today}T00:00:00Z`) - 6 * 86_400_000).toISOString().slice(0, 10);
  assert.equal(await page.getByLabel("From", { exact: true }).inputValue(), from);
  assert.equal(await page.getByLabel("To", { exact: true }).inputValue(), today);
  const end = new Date(Date.parse(`${today}T00:00:00Z`) + 86_400_000).toISOString();
  const api = await berth.call("GET", `/api/v1/usage/report?from=${from}T00:00:00Z&to=${end}`);
  // erin's run of this morning.
  await page.getByTestId("report-total-gpu-hours").filter({ hasText: hours(api.totals.gpu_hours) }).waitFor();
  await page.screenshot({ path: join(ARTIFACTS, "reports-last-7-days.png"), fullPage: true });
  await page.close();
});

test("a member of vision sees the report the API gives it", async () => {
  const member = berth.token("member", "vision");
  const page = await signedIn(member);
  await seededWeek(page);
  const r = await fetch(`${berth.origin}/api/v1/usage/report?${PERIOD}&group_by=team,owner`, {
    headers: { Authorization: `Bearer ${member}` },
  }).then((x) => x.json());
  await page.getByTestId("report-total-gpu-hours").filter({ hasText: hours(r.totals.gpu_hours) }).waitFor();
  assert.equal(await page.getByTestId("report-total-cost").textContent(), money(r.totals.cost));
  const shown = await page.locator("tr[data-owner]").evaluateAll((rows) => rows.map((x) => x.dataset.owner).sort());
  const expected = r.rows.map((x) => `${x.team}/${x.owner}`).filter((k) => r.teams.some((t) => k.startsWith(`${t.team}/`)));
  assert.deepEqual(shown, expected.sort());
  await page.screenshot({ path: join(ARTIFACTS, "reports-member.png"), fullPage: true });
  await page.close();
});

test("the Teams page shows each team's GPU-hours and cost this month, as the API reports them", async () => {
  const page = await signedIn();
  await page.goto(berth.origin + "/#/teams");
  const from = `${new Date().toISOString().slice(0, 8)}01T00:00:00Z`;
  const month = await berth.call("GET", `/api/v1/usage/report?from=${from}`);
  for (const team of ["research", "nlp", "vision"]) {
    const t = month.teams.find((x) => x.team === team)?.subtree ?? { gpu_hours: 0, cost: 0, unpriced_gpu_hours: 0 };
    await page.getByTestId(`month-gpu-hours-${team}`).filter({ hasText: hours(t.gpu_hours) }).waitFor();
    const marked = t.unpriced_gpu_hours > 0 ? "*" : "";
    assert.equal(await page.getByTestId(`month-cost-${team}`).textContent(), money(t.cost) + marked);
  }
  // erin's run counts for nlp and its department.
  assert.notEqual(await page.getByTestId("month-gpu-hours-research").textContent(), "0.0");
  await page.screenshot({ path: join(ARTIFACTS, "teams-month.png"), fullPage: true });
  await page.close();
});

test("on a narrow screen the Reports page fits its width", async () => {
  const page = await signedIn(berth.admin, { width: 390, height: 844 });
  await seededWeek(page);
  await page.getByTestId("report-total-gpu-hours").filter({ hasText: hours(TOTALS.gpu_hours) }).waitFor();
  await page.locator(".chart svg").waitFor();
  await page.screenshot({ path: join(ARTIFACTS, "narrow-reports.png"), fullPage: true });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0, `the page is ${overflow} px wider than the screen`);
  await page.close();
});
