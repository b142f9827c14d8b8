-- Each team's GPUs per flavor over time, for the dashboard's allocation chart: the
-- scheduler adds a row whenever its count for a (team, flavor) changes, so the rows form a
-- step function (a value holds until the next row). Rows older than the retention are
-- pruned by the orphan collector.
CREATE TABLE usage_history (
    team_uid  uuid             NOT NULL REFERENCES teams (uid) ON DELETE CASCADE,
    flavor    text             NOT NULL,
    at        timestamptz      NOT NULL DEFAULT now(),
    allocated double precision NOT NULL,
    borrowed  double precision NOT NULL,
    PRIMARY KEY (team_uid, flavor, at)
);

CREATE INDEX usage_history_at ON usage_history (at);
