-- Dispatch intents: the dispatcher records (workload, attempt) here, committed, *before* it
-- submits the attempt's job, and removes the record in the transaction that marks the
-- workload dispatched. A record found when a workload is claimed means an earlier submit
-- may have reached the backend (the dispatcher died, or the answer was lost), so the job
-- is looked up by key before anything is submitted; without one there is nothing to look
-- up, which spares a listing of the backend's jobs per batch.
--
-- No foreign key: inserting would take a key-share lock on the workload row, which the
-- dispatcher itself holds FOR UPDATE in its claiming transaction.
CREATE TABLE dispatch_intents (
    workload_uid uuid        NOT NULL,
    attempt      integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workload_uid, attempt)
);
