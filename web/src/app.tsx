import { useEffect, useState } from "preact/hooks";
import { ApiError, LoginConfig, Me, abilities, api, saveToken, savedToken } from "./api";
import { beginSignIn, finishSignIn, returningFromProvider, scheduleRefresh, stopRefresh } from "./oidc";
import { Access } from "./pages/access";
import { Audit } from "./pages/audit";
import { Overview } from "./pages/overview";
import { Clusters } from "./pages/clusters";
import { Queue } from "./pages/queue";
import { Reports } from "./pages/reports";
import { Teams } from "./pages/teams";
import { WorkloadDetail, Workloads } from "./pages/workloads";

/// The pages, by the hash that shows them.
const PAGES: {
  hash: string;
  title: string;
  view: (p: { me: Me }) => preact.JSX.Element;
  /// Listed for those who may use it (all when absent).
  for?: (me: Me) => boolean;
}[] = [
  { hash: "#/overview", title: "Overview", view: Overview },
  { hash: "#/teams", title: "Teams", view: Teams },
  { hash: "#/queue", title: "Queue", view: Queue },
  { hash: "#/workloads", title: "Workloads", view: Workloads },
  { hash: "#/clusters", title: "Clusters", view: Clusters },
  { hash: "#/reports", title: "Reports", view: Reports },
  { hash: "#/access", title: "Access", view: Access, for: (me) => abilities(me).managesAccess },
  { hash: "#/audit", title: "Audit", view: Audit, for: (me) => abilities(me).readsAudit },
];

/// Pages reached by links, not listed in the navigation.
const DETAILS = [{ hash: "#/workload/", view: WorkloadDetail }];

/// A sign-in under way (the start-up check runs once).
let signingIn = false;

export function App() {
  const [me, setMe] = useState<Me | null>(null);
  const [checking, setChecking] = useState(savedToken() !== null || returningFromProvider());
  const [failed, setFailed] = useState<string | null>(null);
  const [login, setLogin] = useState<LoginConfig | null>(null);
  const [hash, setHash] = useState(location.hash || PAGES[0].hash);

  useEffect(() => {
    api<LoginConfig>("/auth/config")
      .then(setLogin)
      .catch(() => setLogin({}));
  }, []);

  useEffect(() => {
    const onHash = () => setHash(location.hash || PAGES[0].hash);
    addEventListener("hashchange", onHash);
    return () => removeEventListener("hashchange", onHash);
  }, []);

  useEffect(() => {
    if (!checking) return;
    if (returningFromProvider() && !login) return; // wait for the provider's address
    // Once: the provider's address arriving must not ask again (the second answer, without
    // the token the first one's 401 let go, said "no bearer token").
    if (signingIn) return;
    signingIn = true;
    (async () => {
      if (returningFromProvider()) {
        if (!login?.oidc) throw new Error("Berth names no identity provider to finish signing in with");
        await finishSignIn(login.oidc);
        setHash(location.hash || PAGES[0].hash);
      }
      scheduleRefresh();
      setMe(await api<Me>("/api/v1/me"));
    })()
      .catch((e) => {
        // Only a refused token is let go: Berth answering 503 (a database failover) or 429
        // at a reload keeps the session for the next try.
        if (!(e instanceof ApiError) || e.status === 401) saveToken(null);
        setFailed(e instanceof ApiError ? e.message : String(e instanceof Error ? e.message : e));
      })
      .finally(() => {
        signingIn = false;
        setChecking(false);
      });
  }, [checking, login]);

  if (checking) return <p class="loading">Signing in…</p>;
  if (!me) return <SignIn login={login} failed={failed} onSignedIn={setMe} />;
  const page = PAGES.find((p) => hash.startsWith(p.hash));
  // A page left out of the navigation for this role is not shown by its address either.
  const View =
    page?.for && !page.for(me)
      ? NotYours
      : (page?.view ?? DETAILS.find((d) => hash.startsWith(d.hash))?.view ?? PAGES[0].view);
  return (
    <div class="shell">
      <header>
        <span class="brand">Berth</span>
        <nav aria-label="Pages">
          {PAGES.filter((p) => !p.for || p.for(me)).map((p) => (
            <a href={p.hash} aria-current={p === page ? "page" : undefined}>
              {p.title}
            </a>
          ))}
        </nav>
        <span class="who">
          {me.subject}{" "}
          <button
            type="button"
            onClick={() => {
              stopRefresh();
              saveToken(null);
              setMe(null);
            }}
          >
            Sign out
          </button>
        </span>
      </header>
      <main>
        <View key={hash} me={me} />
      </main>
    </div>
  );
}

function NotYours() {
  return (
    <p class="error" role="alert">
      This page is not for your role: your token grants none of what it shows.
    </p>
  );
}

function SignIn({
  login,
  failed,
  onSignedIn,
}: {
  login: LoginConfig | null;
  failed: string | null;
  onSignedIn: (me: Me) => void;
}) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [leaving, setLeaving] = useState(false);
  const oidc = login?.oidc?.web_client_id ? login.oidc : null;
  const submit = async (e: Event) => {
    e.preventDefault();
    saveToken(token.trim());
    try {
      onSignedIn(await api<Me>("/api/v1/me"));
    } catch (err) {
      saveToken(null);
      setError(err instanceof ApiError && err.status === 401 ? "This token is not valid." : String(err));
    }
  };
  return (
    <form class="sign-in" onSubmit={submit}>
      <h1>Berth</h1>
      {failed && (
        <p class="error" role="alert">
          Not signed in: {failed}
        </p>
      )}
      {oidc && (
        <>
          <button
            type="button"
            disabled={leaving}
            onClick={() => {
              setLeaving(true);
              beginSignIn(oidc).catch((e) => {
                setLeaving(false);
                setError(String(e instanceof Error ? e.message : e));
              });
            }}
          >
            Sign in with {new URL(oidc.issuer).host}
          </button>
          <p class="muted">or with a token of Berth's own:</p>
        </>
      )}
      <label for="token">Access token</label>
      <textarea
        id="token"
        rows={4}
        value={token}
        onInput={(e) => setToken(e.currentTarget.value)}
        placeholder="Paste the token scripts/run printed, or one from berthd token create"
        aria-describedby={error ? "token-error" : undefined}
        required
      />
      {error && (
        <p id="token-error" class="error" role="alert">
          {error}
        </p>
      )}
      <button type="submit">Sign in</button>
    </form>
  );
}

/// Runs `load` now, every `ms` milliseconds while the page shows, and at once when one of
/// `deps` changes; the last value and error, and a function to load again at once.
export function usePoll<T>(
  load: () => Promise<T>,
  deps: unknown[] = [],
  ms = 5000,
): [T | null, ApiError | null, () => void] {
  const [value, setValue] = useState<T | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    // A tick while the last load is unanswered is skipped: a slow Berth got a new request
    // from each open page every 5 s on top of those still waiting.
    let loading = false;
    const run = () => {
      if (loading) return;
      loading = true;
      load()
        .then((v) => live && (setValue(v), setError(null)))
        .catch((e) => live && setError(ApiError.of(e)))
        .finally(() => (loading = false));
    };
    run();
    const timer = setInterval(run, ms);
    return () => {
      live = false;
      clearInterval(timer);
    };
  }, [tick, ...deps]);
  return [value, error, () => setTick((t) => t + 1)];
}

/// Paging through a list by its `next` cursors: the cursor of the page shown (none for the
/// first), and the way back. `first()` goes back to the first page (a filter changed).
export function useCursors() {
  const [pages, setPages] = useState<string[]>([]);
  return {
    cursor: pages[pages.length - 1] as string | undefined,
    first: () => setPages([]),
    back: pages.length > 0 ? () => setPages(pages.slice(0, -1)) : undefined,
    on: (next: string) => setPages([...pages, next]),
  };
}

/// The buttons to the page before and after, labelled `labels`.
export function Pager({
  cursors,
  next,
  labels,
}: {
  cursors: ReturnType<typeof useCursors>;
  next?: string | null;
  labels: [string, string];
}) {
  return (
    <div class="actions">
      <button type="button" disabled={!cursors.back} onClick={() => cursors.back?.()}>
        {labels[0]}
      </button>
      <button type="button" disabled={!next} onClick={() => next && cursors.on(next)}>
        {labels[1]}
      </button>
    </div>
  );
}
