import { useState } from "preact/hooks";
import {
  ApiError,
  Flavor,
  Me,
  Quota,
  QuotaPreview,
  Team,
  UsageReport,
  abilities,
  all,
  api,
  deleteSeen,
  reportPath,
  updateSpec,
} from "../api";
import { usePoll } from "../app";
import { Field, Unplaced } from "../form";
import { fmt } from "./overview";
import { Cost, hours } from "./reports";

/// Teams in tree order (parents before children, siblings by name), with their depth.
export function treeOrder(teams: Team[]): { team: Team; depth: number }[] {
  const children = new Map<string | null, Team[]>();
  for (const t of teams) {
    const parent = t.spec.parent && teams.some((p) => p.metadata.name === t.spec.parent) ? t.spec.parent : null;
    children.set(parent, [...(children.get(parent) ?? []), t]);
  }
  const out: { team: Team; depth: number }[] = [];
  const walk = (parent: string | null, depth: number) => {
    for (const t of (children.get(parent) ?? []).sort((a, b) => a.metadata.name.localeCompare(b.metadata.name))) {
      out.push({ team: t, depth });
      walk(t.metadata.name, depth + 1);
    }
  };
  walk(null, 0);
  return out;
}

/// Whether the principal may change or delete `team`: platform admins anywhere, team admins
/// below (never at) the team they administer. The API has the last word.
function mayEdit(me: Me, teams: Team[], team: Team): boolean {
  const a = abilities(me);
  if (a.platformAdmin) return true;
  let parent = team.spec.parent;
  while (parent) {
    if (a.adminOf.includes(parent)) return true;
    parent = teams.find((t) => t.metadata.name === parent)?.spec.parent;
  }
  return false;
}

/// The teams the principal manages (their sub-teams, roles and service accounts), in tree
/// order: every team for platform admins, else those a team admin administers and every
/// team below them.
export function administered(me: Me, teams: Team[]): string[] {
  const adminOf = abilities(me).adminOf;
  return treeOrder(teams)
    .map(({ team }) => team)
    .filter((t) => adminOf.includes(t.metadata.name) || mayEdit(me, teams, t))
    .map((t) => t.metadata.name);
}

export function Teams({ me }: { me: Me }) {
  const [teams, error, reload] = usePoll(() => all<Team>("/api/v1/teams"));
  // This month's GPU-hours and cost of each team's subtree (a department's total), from one
  // report; read less often, and the table shows without it.
  const [month] = usePoll(
    () => api<UsageReport>(reportPath({ from: `${new Date().toISOString().slice(0, 8)}01T00:00:00Z` })),
    [],
    60_000,
  );
  const [editing, setEditing] = useState<string | null>(null);
  const [creating, setCreating] = useState(false);
  const [removeProblem, setRemoveProblem] = useState<string | null>(null);
  if (!teams) return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  const ordered = treeOrder(teams);
  const team = teams.find((t) => t.metadata.name === editing);
  // A new team goes under a team the principal manages, or is a department (platform admins).
  const placement = { parents: administered(me, teams), topLevel: abilities(me).platformAdmin };
  const remove = async (t: Team) => {
    const name = t.metadata.name;
    if (!confirm(`Delete team ${name}? Its quotas and role bindings go with it.`)) return;
    setRemoveProblem(null);
    try {
      await deleteSeen(`/api/v1/teams/${name}`, t.spec);
      reload();
    } catch (e) {
      setRemoveProblem(`${name} was not deleted: ${e instanceof Error ? e.message : String(e)}`);
    }
  };
  return (
    <>
      <h1>Teams</h1>
      {error && <p class="error" role="alert">Not refreshed: {error.message}</p>}
      {removeProblem && (
        <p class="error" role="alert">
          {removeProblem}
        </p>
      )}
      {(placement.topLevel || placement.parents.length > 0) && !creating && (
        <div class="actions">
          <button type="button" onClick={() => setCreating(true)}>
            New team
          </button>
        </div>
      )}
      {creating && (
        <NewTeam
          {...placement}
          onDone={(created) => {
            setCreating(false);
            if (created) {
              reload();
              setEditing(created);
            }
          }}
        />
      )}
      <table class="teams">
        <thead>
          <tr>
            <th scope="col">Team</th>
            <th scope="col">Flavor</th>
            <th scope="col" class="num">Guaranteed</th>
            <th scope="col" class="num">Limit</th>
            <th scope="col" class="num">Weight</th>
            <th scope="col" class="num">Allocated</th>
            <th scope="col" class="num">Borrowed</th>
            <th scope="col" class="num">Fair share</th>
            <th scope="col">Against its guarantee</th>
            <th scope="col" class="num" title="The team and every team below it, since the 1st (UTC)">
              GPU-hours this month
            </th>
            <th scope="col" class="num" title="The team and every team below it, since the 1st (UTC)">
              Cost this month
            </th>
            <th scope="col">
              <span class="visually-hidden">Actions</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {ordered.flatMap(({ team: t, depth }) => {
            const flavors = [...new Set([...(t.spec.quotas ?? []).map((q) => q.flavor), ...t.status.usage.map((u) => u.flavor)])];
            const rows = flavors.length ? flavors : [null];
            return rows.map((flavor, i) => {
              const q = t.spec.quotas?.find((q) => q.flavor === flavor);
              const u = t.status.usage.find((u) => u.flavor === flavor);
              // Where the tree shares over time, the fair share counts the subtree's recent use.
              const recent = t.status.recent_usage?.flavors.find((r) => r.flavor === flavor);
              // A department's guarantee covers its whole subtree: show the subtree's totals.
              const over = u && u.subtree_borrowed > 0;
              const spent = month?.teams.find((m) => m.team === t.metadata.name)?.subtree;
              return (
                <tr data-team={t.metadata.name} data-flavor={flavor ?? undefined} class={over ? "over" : undefined}>
                  <th scope="row" style={{ paddingLeft: `${0.6 + depth * 1.2}rem` }}>
                    {i === 0 && t.metadata.name}
                  </th>
                  <td>{flavor ?? <span class="muted">no quota</span>}</td>
                  <td class="num">{q ? q.guaranteed : flavor ? 0 : ""}</td>
                  <td class="num">{q?.limit ?? (flavor ? "none" : "")}</td>
                  <td class="num">{q ? q.weight : flavor ? 1 : ""}</td>
                  <td class="num" title={u ? `its own workloads: ${fmt(u.allocated)}` : undefined}>
                    {u ? fmt(u.subtree_allocated) : flavor ? 0 : ""}
                  </td>
                  <td class="num">
                    {u && u.subtree_borrowed > 0 ? (
                      <span title="above its guarantee">{fmt(u.subtree_borrowed)}</span>
                    ) : flavor ? (
                      0
                    ) : (
                      ""
                    )}
                  </td>
                  <td class="num" title={recent ? `weighed by recent use: ${hours(recent.subtree_gpu_hours)} GPU-hours, decayed` : undefined}>
                    {u ? fmt(u.subtree_fair_share) : ""}
                  </td>
                  <td>{flavor && standing(u?.subtree_allocated ?? 0, q?.guaranteed ?? 0)}</td>
                  <td class="num" data-testid={i === 0 ? `month-gpu-hours-${t.metadata.name}` : undefined}>
                    {i === 0 && month && hours(spent?.gpu_hours ?? 0)}
                  </td>
                  <td class="num" data-testid={i === 0 ? `month-cost-${t.metadata.name}` : undefined}>
                    {i === 0 && month && <Cost of={spent ?? { cost: 0, unpriced_gpu_hours: 0 }} />}
                  </td>
                  <td class="row-actions">
                    {i === 0 && mayEdit(me, teams, t) && (
                      <>
                        <button type="button" onClick={() => setEditing(t.metadata.name)}>
                          Edit quotas<span class="visually-hidden"> of {t.metadata.name}</span>
                        </button>{" "}
                        <button type="button" onClick={() => remove(t)}>
                          Delete<span class="visually-hidden"> team {t.metadata.name}</span>
                        </button>
                      </>
                    )}
                  </td>
                </tr>
              );
            });
          })}
        </tbody>
      </table>
      {team && (
        <QuotaEditor
          key={team.metadata.name}
          team={team}
          onDone={() => {
            setEditing(null);
            reload();
          }}
        />
      )}
    </>
  );
}

/// A team's use of a flavor against its guarantee, in words.
function standing(allocated: number, guaranteed: number): string {
  if (allocated > guaranteed) return `over by ${fmt(allocated - guaranteed)}`;
  if (allocated < guaranteed) return `under by ${fmt(guaranteed - allocated)}`;
  return allocated > 0 ? "at it" : "";
}

/// A form for a new team: its name and where it goes; the API's messages beside the fields.
/// It is created only if no team has the name (`If-None-Match: *`), never replacing one.
function NewTeam({ parents, topLevel, onDone }: { parents: string[]; topLevel: boolean; onDone: (created?: string) => void }) {
  const [name, setName] = useState("");
  const [parent, setParent] = useState(topLevel ? "" : parents[0]);
  const [problem, setProblem] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setProblem(null);
    const team = name.trim();
    try {
      await api(`/api/v1/teams/${encodeURIComponent(team)}`, {
        method: "PUT",
        headers: { "If-None-Match": "*" },
        body: { spec: parent ? { parent } : {} },
      });
      onDone(team);
    } catch (err) {
      // A name taken (412), or taken by a team the principal may not see (404), is the
      // name field's problem.
      const p = ApiError.of(err);
      const taken = p.status === 412 ? `a team named ${team} exists` : p.status === 404 ? p.message : null;
      setProblem(taken ? new ApiError(p.status, p.title, p.detail, [{ field: "/metadata/name", message: taken }]) : p);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="editor" aria-labelledby="new-team-heading" onSubmit={submit}>
      <h2 id="new-team-heading">New team</h2>
      <Field id="new-team-name" label="Name" problem={problem} field="/metadata/name">
        {(a) => (
          <input
            {...a}
            value={name}
            required
            placeholder="lower-case-letters-digits"
            onInput={(e) => setName(e.currentTarget.value)}
          />
        )}
      </Field>
      <Field id="new-team-parent" label="Under" problem={problem} field="/spec/parent">
        {(a) => (
          <select {...a} value={parent} onChange={(e) => setParent(e.currentTarget.value)}>
            {topLevel && <option value="">no team (a department)</option>}
            {parents.map((p) => (
              <option>{p}</option>
            ))}
          </select>
        )}
      </Field>
      <Unplaced problem={problem} fields={["/metadata/name", "/spec/parent"]} />
      <div class="actions">
        <button type="submit" disabled={busy}>
          Create
        </button>
        <button type="button" onClick={() => onDone()}>
          Cancel
        </button>
      </div>
    </form>
  );
}

type Draft = { flavor: string; guaranteed: string; limit: string; weight: string };
const FIELDS = ["guaranteed", "limit", "weight"] as const;

function QuotaEditor({ team, onDone }: { team: Team; onDone: () => void }) {
  const name = team.metadata.name;
  // The spec as the editor opened it: `team` is refreshed every 5 s, and a save compared
  // against the refreshed one overwrote another admin's change made meanwhile.
  const [opened] = useState(team.spec);
  const [draft, setDraft] = useState<Draft[]>(
    (team.spec.quotas ?? []).map((q) => ({
      flavor: q.flavor,
      guaranteed: String(q.guaranteed),
      limit: q.limit == null ? "" : String(q.limit),
      weight: String(q.weight),
    })),
  );
  const [problem, setProblem] = useState<ApiError | null>(null);
  const [preview, setPreview] = useState<QuotaPreview | null>(null);
  const [busy, setBusy] = useState(false);
  // The flavors a quota can be added for: those that exist and the team declares none of.
  const [flavors] = usePoll(() => all<Flavor>("/api/v1/flavors"), [], 60_000);
  const addable = (flavors ?? []).map((f) => f.metadata.name).filter((f) => !draft.some((d) => d.flavor === f));
  const quotas = () =>
    draft.map(
      (d): Quota => ({
        flavor: d.flavor,
        guaranteed: Number(d.guaranteed),
        limit: d.limit.trim() === "" ? null : Number(d.limit),
        weight: Number(d.weight),
      }),
    );
  const run = async (what: "preview" | "save") => {
    // Whole numbers, as the API takes them: "abc" went as null and an empty field as 0,
    // which the preview showed as a guarantee of 0 with no word next to the field.
    const wrong = draft.flatMap((d, i) =>
      FIELDS.filter((f) => !(f === "limit" && d.limit.trim() === "") && !/^\d+$/.test(d[f].trim())).map((f) => ({
        field: `/spec/quotas/${i}/${f}`,
        message: f === "weight" ? "must be a whole number" : "must be a whole number of GPUs",
      })),
    );
    if (wrong.length > 0) {
      setPreview(null);
      setProblem(new ApiError(422, "Invalid quota", "", wrong));
      return;
    }
    setBusy(true);
    setProblem(null);
    try {
      const path = `/api/v1/teams/${name}`;
      if (what === "preview") {
        const body = { spec: { ...opened, quotas: quotas() } };
        setPreview(await api<QuotaPreview>(`${path}/preview`, { method: "POST", body }));
      } else {
        await updateSpec<Team["spec"]>(path, (spec) => ({ ...spec, quotas: quotas() }), opened);
        onDone();
      }
    } catch (e) {
      setPreview(null);
      setProblem(ApiError.of(e));
    } finally {
      setBusy(false);
    }
  };
  const set = (i: number, field: keyof Draft, value: string) => {
    setPreview(null);
    setDraft(draft.map((d, j) => (j === i ? { ...d, [field]: value } : d)));
  };
  const change = (next: Draft[]) => {
    setPreview(null);
    setProblem(null);
    setDraft(next);
  };
  const input = (i: number, field: (typeof FIELDS)[number], label: string) => (
    <Field id={`q-${i}-${field}`} label={`${label} (${draft[i].flavor})`} problem={problem} field={`/spec/quotas/${i}/${field}`}>
      {(a) => (
        <input
          {...a}
          inputMode="numeric"
          value={draft[i][field]}
          placeholder={field === "limit" ? "none" : undefined}
          onInput={(e) => set(i, field, e.currentTarget.value)}
        />
      )}
    </Field>
  );
  return (
    <section class="editor" aria-labelledby="editor-heading">
      <h2 id="editor-heading">Quotas of {name}</h2>
      {draft.length === 0 && <p class="muted">This team declares no quota.</p>}
      {draft.map((_, i) => (
        <fieldset>
          <legend>{draft[i].flavor}</legend>
          {input(i, "guaranteed", "Guaranteed GPUs")}
          {input(i, "limit", "Limit (GPUs)")}
          {input(i, "weight", "Weight")}
          <button type="button" class="remove" onClick={() => change(draft.filter((_, j) => j !== i))}>
            Remove<span class="visually-hidden"> the {draft[i].flavor} quota</span>
          </button>
        </fieldset>
      ))}
      {addable.length > 0 && (
        <div class="field">
          <label for="add-flavor">Add a quota for</label>
          <select
            id="add-flavor"
            value=""
            onChange={(e) => {
              const flavor = e.currentTarget.value;
              if (flavor) change([...draft, { flavor, guaranteed: "0", limit: "", weight: "1" }]);
            }}
          >
            <option value="">a flavor…</option>
            {addable.map((f) => (
              <option>{f}</option>
            ))}
          </select>
        </div>
      )}
      <Unplaced problem={problem} fields={draft.flatMap((_, i) => FIELDS.map((f) => `/spec/quotas/${i}/${f}`))} />
      {preview && (
        <div class="preview" role="status" aria-label="Preview">
          <h3>If saved</h3>
          {preview.summary.length === 0 ? (
            <p>Nothing would change now.</p>
          ) : (
            <ul>
              {preview.summary.map((line) => (
                <li>{line}</li>
              ))}
            </ul>
          )}
        </div>
      )}
      <div class="actions">
        <button type="button" disabled={busy} onClick={() => run("preview")}>
          Preview
        </button>
        <button type="submit" disabled={busy} onClick={() => run("save")}>
          Save
        </button>
        <button type="button" onClick={onDone}>
          Cancel
        </button>
      </div>
    </section>
  );
}
