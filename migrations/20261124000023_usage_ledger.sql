-- The accounting ledger: one record per workload attempt that held GPUs, written by the
-- controllers in the transaction that ends the attempt (exactly once: the key), from
-- facts (the job's start and end), not samples. Names are kept as they were: a record
-- outlives its workload and its team (no foreign keys).
CREATE TABLE usage_ledger (
    workload_uid uuid             NOT NULL,
    attempt      integer          NOT NULL,
    team         text             NOT NULL,
    -- The team and its ancestors when the attempt ended, nearest first.
    teams        text[]           NOT NULL,
    workload     text             NOT NULL,
    owner        text,
    flavor       text             NOT NULL,
    cluster      text             NOT NULL,
    backend      text             NOT NULL,
    kind         text             NOT NULL,
    gpus         double precision NOT NULL,
    borrowed     boolean          NOT NULL,
    -- Null when the job never started (admitted, then stopped before it ran).
    started_at   timestamptz,
    ended_at     timestamptz      NOT NULL,
    outcome      text             NOT NULL
        CHECK (outcome IN ('succeeded', 'failed', 'cancelled', 'preempted', 'requeued', 'deleted')),
    PRIMARY KEY (workload_uid, attempt)
);
CREATE INDEX usage_ledger_ended_at ON usage_ledger (ended_at);
