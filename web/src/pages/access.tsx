import { useState } from "preact/hooks";
import {
  ApiError,
  CreatedToken,
  Me,
  Role,
  RoleBindingList,
  ServiceAccount,
  ServiceAccountList,
  Team,
  TokenList,
  abilities,
  all,
  api,
} from "../api";
import { usePoll } from "../app";
import { Field, Unplaced } from "../form";
import { administered } from "./teams";

/// Roles and service accounts, for platform admins and team admins: grant and revoke roles
/// in their subtree, create service accounts and their tokens (each shown once).
export function Access({ me }: { me: Me }) {
  const [teams] = usePoll(() => all<Team>("/api/v1/teams"), [], 30_000);
  const [bindings, bindingsError, reloadBindings] = usePoll(() => api<RoleBindingList>("/api/v1/role-bindings"));
  const [accounts, accountsError, reloadAccounts] = usePoll(() => api<ServiceAccountList>("/api/v1/service-accounts"));
  const [problem, setProblem] = useState<string | null>(null);
  if (!teams || !bindings || !accounts) {
    const error = bindingsError ?? accountsError;
    return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  }
  const mine = administered(me, teams);
  const platformAdmin = abilities(me).platformAdmin;
  const manages = (team?: string | null) => platformAdmin || (!!team && mine.includes(team));
  const act = async (what: string, run: () => Promise<unknown>, then: () => void) => {
    setProblem(null);
    try {
      await run();
      then();
    } catch (e) {
      setProblem(`${what}: ${ApiError.of(e).message}`);
    }
  };
  return (
    <>
      <h1>Access</h1>
      {problem && (
        <p class="error" role="alert">
          {problem}
        </p>
      )}
      <section aria-labelledby="roles-heading">
        <h2 id="roles-heading">Roles</h2>
        <table class="bindings">
          <thead>
            <tr>
              <th scope="col">Subject</th>
              <th scope="col">Role</th>
              <th scope="col">Team</th>
              <th scope="col">Granted by</th>
              <th scope="col">
                <span class="visually-hidden">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {bindings.items.map((b) => (
              <tr data-binding={b.id}>
                <td title={b.issuer ?? undefined}>{b.subject}</td>
                <td>{b.role}</td>
                <td>{b.team ?? "all (global)"}</td>
                <td>
                  {b.created_by} <span class="muted">{new Date(b.created_at).toLocaleDateString()}</span>
                </td>
                <td>
                  {manages(b.team) && (
                    <button
                      type="button"
                      onClick={() =>
                        confirm(`Revoke ${b.role} of ${b.subject}?`) &&
                        act(`${b.subject}'s ${b.role} was not revoked`, () => api(`/api/v1/role-bindings/${b.id}`, { method: "DELETE" }), reloadBindings)
                      }
                    >
                      Revoke<span class="visually-hidden"> {b.role} of {b.subject} on {b.team ?? "all teams"}</span>
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        {bindings.items.length === 0 && <p class="muted">No role is granted here yet (tokens may carry their own).</p>}
        <Grant teams={mine} platformAdmin={platformAdmin} onDone={reloadBindings} />
      </section>
      <section aria-labelledby="accounts-heading">
        <h2 id="accounts-heading">Service accounts</h2>
        {accounts.items.length === 0 ? (
          <p class="muted">No service account.</p>
        ) : (
          accounts.items.map((a) => (
            <Account
              account={a}
              manages={manages(a.team)}
              onDelete={() =>
                confirm(`Delete service account ${a.name}? Its tokens stop working.`) &&
                act(`${a.name} was not deleted`, () => api(`/api/v1/service-accounts/${a.name}`, { method: "DELETE" }), reloadAccounts)
              }
            />
          ))
        )}
        <NewAccount teams={mine} platformAdmin={platformAdmin} onDone={reloadAccounts} />
      </section>
    </>
  );
}

/// Grants a role: to a user (its `sub` at the identity provider) or a service account
/// (`serviceaccount:NAME`), on a team in the principal's scope (or globally, for platform
/// admins).
function Grant({ teams, platformAdmin, onDone }: { teams: string[]; platformAdmin: boolean; onDone: () => void }) {
  const roles: Role[] = platformAdmin ? ["member", "team-admin", "viewer", "platform-admin"] : ["member", "team-admin", "viewer"];
  const [subject, setSubject] = useState("");
  const [role, setRole] = useState<Role>("member");
  const [team, setTeam] = useState(teams[0] ?? "");
  const [problem, setProblem] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setProblem(null);
    try {
      await api("/api/v1/role-bindings", { method: "POST", body: { subject, role, ...(team ? { team } : {}) } });
      setSubject("");
      onDone();
    } catch (err) {
      setProblem(ApiError.of(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="editor" aria-labelledby="grant-heading" onSubmit={submit}>
      <h3 id="grant-heading">Grant a role</h3>
      <div class="inline-fields">
        <Field id="grant-subject" label="Subject" problem={problem} field="/subject">
          {(a) => (
            <input
              {...a}
              value={subject}
              required
              placeholder="alice, or serviceaccount:ci"
              onInput={(e) => setSubject(e.currentTarget.value)}
            />
          )}
        </Field>
        <Field id="grant-role" label="Role" problem={problem} field="/role">
          {(a) => (
            <select {...a} value={role} onChange={(e) => setRole(e.currentTarget.value as Role)}>
              {roles.map((r) => (
                <option>{r}</option>
              ))}
            </select>
          )}
        </Field>
        <Field id="grant-team" label="On team" problem={problem} field="/team">
          {(a) => (
            <select {...a} value={team} onChange={(e) => setTeam(e.currentTarget.value)}>
              {platformAdmin && <option value="">all (global)</option>}
              {teams.map((t) => (
                <option>{t}</option>
              ))}
            </select>
          )}
        </Field>
      </div>
      <Unplaced problem={problem} fields={["/subject", "/role", "/team"]} />
      <div class="actions">
        <button type="submit" disabled={busy}>
          Grant
        </button>
      </div>
    </form>
  );
}

function NewAccount({ teams, platformAdmin, onDone }: { teams: string[]; platformAdmin: boolean; onDone: () => void }) {
  const [name, setName] = useState("");
  const [team, setTeam] = useState(teams[0] ?? "");
  const [description, setDescription] = useState("");
  const [problem, setProblem] = useState<ApiError | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setProblem(null);
    try {
      await api("/api/v1/service-accounts", { method: "POST", body: { name: name.trim(), description, ...(team ? { team } : {}) } });
      setName("");
      setDescription("");
      onDone();
    } catch (err) {
      setProblem(ApiError.of(err));
    }
  };
  return (
    <form class="editor" aria-labelledby="account-heading" onSubmit={submit}>
      <h3 id="account-heading">New service account</h3>
      <div class="inline-fields">
        <Field id="account-name" label="Account name" problem={problem} field="/name">
          {(a) => <input {...a} value={name} required onInput={(e) => setName(e.currentTarget.value)} />}
        </Field>
        <Field id="account-team" label="Owned by" problem={problem} field="/team">
          {(a) => (
            <select {...a} value={team} onChange={(e) => setTeam(e.currentTarget.value)}>
              {platformAdmin && <option value="">no team (global)</option>}
              {teams.map((t) => (
                <option>{t}</option>
              ))}
            </select>
          )}
        </Field>
        <Field id="account-description" label="Description" problem={problem} field="/description">
          {(a) => <input {...a} value={description} onInput={(e) => setDescription(e.currentTarget.value)} />}
        </Field>
      </div>
      <Unplaced problem={problem} fields={["/name", "/team", "/description"]} />
      <div class="actions">
        <button type="submit">Create account</button>
      </div>
    </form>
  );
}

/// How long a new token may live, offered as choices.
const LIFETIMES: [string, number][] = [
  ["1 day", 86_400],
  ["30 days", 30 * 86_400],
  ["90 days", 90 * 86_400],
  ["366 days", 366 * 86_400],
];

/// A service account with its tokens; a new token is shown once, here, and never again.
function Account({ account, manages, onDelete }: { account: ServiceAccount; manages: boolean; onDelete: () => void }) {
  const name = account.name;
  const [tokens, error, reload] = usePoll(() => api<TokenList>(`/api/v1/service-accounts/${name}/tokens`), [], 30_000);
  const [ttl, setTtl] = useState(LIFETIMES[2][1]);
  const [created, setCreated] = useState<CreatedToken | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const mint = async () => {
    setProblem(null);
    try {
      setCreated(await api<CreatedToken>(`/api/v1/service-accounts/${name}/tokens`, { method: "POST", body: { ttl_seconds: ttl } }));
      reload();
    } catch (e) {
      setProblem(ApiError.of(e).message);
    }
  };
  const revoke = async (id: string) => {
    setProblem(null);
    try {
      await api(`/api/v1/service-accounts/${name}/tokens/${id}`, { method: "DELETE" });
      reload();
    } catch (e) {
      setProblem(ApiError.of(e).message);
    }
  };
  const when = (t?: string | null) => (t ? new Date(t).toLocaleString() : "—");
  return (
    <article class="account" data-account={name} aria-labelledby={`account-${name}`}>
      <h3 id={`account-${name}`}>
        {name} <span class="muted">{account.team ? `team ${account.team}` : "global"}</span>
      </h3>
      {account.description && <p>{account.description}</p>}
      <p class="muted">
        Acts as <code>{account.subject}</code>; grant it a role above.
      </p>
      {(problem || error) && (
        <p class="error" role="alert">
          {problem ?? error?.message}
        </p>
      )}
      {created && (
        <div class="created-token" role="status" aria-label={`New token for ${name}`}>
          <p>This token is shown only now: copy it.</p>
          <textarea readOnly rows={3} value={created.token} aria-label={`Token for ${name}`} />
          <button type="button" onClick={() => setCreated(null)}>
            Done
          </button>
        </div>
      )}
      {tokens && tokens.items.length > 0 && (
        <table class="tokens">
          <thead>
            <tr>
              <th scope="col">Created</th>
              <th scope="col">Expires</th>
              <th scope="col">Last used</th>
              <th scope="col">Revoked</th>
              <th scope="col">
                <span class="visually-hidden">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {tokens.items.map((t) => (
              <tr data-token={t.id}>
                <td>{when(t.created_at)}</td>
                <td>{when(t.expires_at)}</td>
                <td>{when(t.last_used_at)}</td>
                <td>{when(t.revoked_at)}</td>
                <td>
                  {manages && !t.revoked_at && (
                    <button type="button" onClick={() => revoke(t.id)}>
                      Revoke<span class="visually-hidden"> token of {name} created {when(t.created_at)}</span>
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {manages && (
        <div class="actions">
          <label>
            Valid for{" "}
            <select value={ttl} onChange={(e) => setTtl(Number(e.currentTarget.value))} aria-label={`Lifetime of a new token for ${name}`}>
              {LIFETIMES.map(([words, s]) => (
                <option value={s}>{words}</option>
              ))}
            </select>
          </label>
          <button type="button" onClick={mint}>
            New token<span class="visually-hidden"> for {name}</span>
          </button>
          <button type="button" onClick={onDelete}>
            Delete<span class="visually-hidden"> service account {name}</span>
          </button>
        </div>
      )}
    </article>
  );
}
