-- A workload's spec as the scheduler reads it: `run` keeps only its image, without the
-- script, command and environment (nearly all of a large spec); whether there is a script
-- or a command at all (Slurm runs nothing else) stays, as a `command` of the one
-- placeholder word `(elided)`. One definition for the full read and the change feed's.
CREATE FUNCTION workload_spec_for_scheduling(spec jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_set(spec, '{run}', jsonb_strip_nulls(jsonb_build_object(
        'image', spec #> '{run,image}',
        'command', CASE WHEN coalesce(spec #>> '{run,script}', '') <> ''
                          OR coalesce(jsonb_array_length(spec #> '{run,command}'), 0) > 0
                        THEN '["(elided)"]'::jsonb END)))
$$;
