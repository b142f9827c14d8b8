-- A workload's owner names a service account by its uid as well as its name, so that an
-- account created again under the name owns none of the old one's work (it could change,
-- cancel and delete it: ownership was by name). Work submitted before names the account
-- that holds the name now: the one that submitted it, unless that one was deleted and
-- the name taken again since, which cannot be told apart any more.
UPDATE workloads w
SET owner = w.owner || jsonb_build_object('service_account_uid', a.uid)
FROM service_accounts a
WHERE w.owner ->> 'subject' = 'serviceaccount:' || a.name
  AND NOT w.owner ? 'service_account_uid';
