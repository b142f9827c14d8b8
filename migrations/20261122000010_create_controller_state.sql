-- Which replica leads the controllers (it also holds a session advisory lock; this row
-- only makes the holder visible), and the last status each controller reported.
CREATE TABLE controller_leader (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    holder     text        NOT NULL,
    since      timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL
);

CREATE TABLE controller_status (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    status     jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
