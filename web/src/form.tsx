// The pieces every form of the dashboard is built from: a field with the API's message
// for it beside it, and what the API said that no field shows.

import { ApiError } from "./api";

/// The attributes a field's control takes from [`Field`]: its id, and its error's
/// description while the API names the field.
export type FieldAttributes = { id: string; "aria-invalid"?: true; "aria-describedby"?: string };

/// A labelled control (`children` renders it with the attributes given) and, when the
/// API's problem names `field` (a JSON pointer into the body), its message beside it.
export function Field({
  id,
  label,
  problem,
  field,
  children,
}: {
  id: string;
  label: string;
  problem: ApiError | null;
  field: string;
  children: (a: FieldAttributes) => preact.JSX.Element;
}) {
  const message = problem?.about(field);
  return (
    <div class="field">
      <label for={id}>{label}</label>
      {children({ id, "aria-invalid": message ? true : undefined, "aria-describedby": message ? `${id}-error` : undefined })}
      {message && (
        <span id={`${id}-error`} class="error">
          {message}
        </span>
      )}
    </div>
  );
}

/// The problem as an alert, unless one of `fields` shows it.
export function Unplaced({ problem, fields }: { problem: ApiError | null; fields: string[] }) {
  if (!problem || fields.some((f) => problem.about(f))) return null;
  return (
    <p class="error" role="alert">
      {problem.errors.length ? problem.errors.map((e) => `${e.field}: ${e.message}`).join("; ") : problem.message}
    </p>
  );
}
