// A real berthd for the browser tests: a scratch database on the DATABASE_URL server, the
// built dashboard (web/dist), simulated clusters, and a platform-admin token; plus the
// headless Chromium Debian ships (never a downloaded browser).

import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const BERTHD = process.env.BERTHD ?? join(process.env.CARGO_TARGET_DIR ?? join(ROOT, "target"), "debug/berthd");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
export const ARTIFACTS = join(ROOT, "web/test-results");

function freePort() {
  return new Promise((done, fail) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => done(port));
    });
    s.on("error", fail);
  });
}

/// Runs `sql` on the database at `url` (the scratch database of a test: `berth.database`).
export function psql(url, sql) {
  execFileSync("psql", [url, "-v", "ON_ERROR_STOP=1", "-qc", sql], { stdio: ["ignore", "ignore", "inherit"] });
}

/// Starts berthd on a fresh database (with `extraEnv` on top of the defaults); `database`
/// is that database's URL (to seed what the API cannot write); `stop()` ends it and drops
/// the database.
export async function startBerth(extraEnv = {}) {
  if (!existsSync(BERTHD)) throw new Error(`no berthd at ${BERTHD}: build it (cargo build -p berthd) or set BERTHD`);
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM}: apt-get install chromium (scripts/install-tools)`);
  const base = process.env.DATABASE_URL;
  if (!base) throw new Error("DATABASE_URL must name a Postgres server whose role may create databases");
  const name = `berth_web_${process.pid}_${Date.now()}`;
  psql(base, `CREATE DATABASE ${name}`);
  const u = new URL(base);
  u.pathname = `/${name}`;
  const url = u.toString();
  const port = await freePort();
  const simDir = mkdtempSync(join(tmpdir(), "berth-web-sim-"));
  const env = {
    ...process.env,
    DATABASE_URL: url,
    BERTH_LISTEN: `127.0.0.1:${port}`,
    BERTH_JWT_SECRET: "browser-test-secret-browser-test-secret",
    BERTH_WEB_DIR: join(ROOT, "web/dist"),
    BERTH_SIM_STATE_DIR: simDir,
    BERTH_DEMO: "false",
    BERTH_LOG_FORMAT: "json",
    RUST_LOG: "warn",
    ...extraEnv,
  };
  const token = (role, team) =>
    execFileSync(BERTHD, ["token", "create", "--subject", `${role}-user`, "--role", role, ...(team ? ["--team", team] : [])], {
      env,
    })
      .toString()
      .trim();
  const child = spawn(BERTHD, ["serve"], { env, stdio: ["ignore", "ignore", "inherit"] });
  const origin = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${origin}/readyz`)).ok) break;
    } catch {}
    if (i > 300) throw new Error("berthd did not become ready in 30 s");
    await new Promise((r) => setTimeout(r, 100));
  }
  const admin = token("platform-admin");
  const call = async (method, path, body, as = admin) => {
    const r = await fetch(origin + path, {
      method,
      headers: { Authorization: `Bearer ${as}`, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
  return {
    origin,
    database: url,
    admin,
    token,
    call,
    async stop() {
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
      psql(base, `DROP DATABASE ${name} WITH (FORCE)`);
      rmSync(simDir, { recursive: true, force: true });
    },
  };
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  });
}

/// Polls `check` until it returns a truthy value (at most `ms`); `seen` says what the
/// last try saw, for the error.
export async function eventually(check, ms = 15000, seen = () => "") {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check().catch(() => null);
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`condition not met in ${ms} ms: ${check}\n${seen()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
