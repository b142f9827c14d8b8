-- The size of each workload's spec as JSON text, computed once when the spec is written.
--
-- A list response has a byte budget (a member with 500 workloads of ~1 MiB specs made
-- every list call build ~512 MB): the list query sums these sizes in order and stops the
-- page where the budget runs out, without turning every spec into text at read time.
ALTER TABLE workloads ADD COLUMN spec_bytes integer GENERATED ALWAYS AS (octet_length(spec::text)) STORED;
