-- spec.slurm.api_version used to default to v0.0.38, the only version Berth spoke, so no
-- stored value of it was anyone's choice. It now defaults to "auto" (the newest version
-- the cluster offers); a cluster pinned to v0.0.38 would break when its Slurm is upgraded.
UPDATE clusters
SET spec = jsonb_set(spec, '{slurm,api_version}', '"auto"'),
    resource_version = nextval('resource_version_seq'),
    updated_at = now()
WHERE spec -> 'slurm' ->> 'api_version' = 'v0.0.38';
