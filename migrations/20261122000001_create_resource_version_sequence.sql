-- One cluster-wide, strictly increasing counter for resource versions (like etcd's
-- revision): every write of any object takes the next value, so versions are comparable
-- across kinds and a future watch can resume from one number.
CREATE SEQUENCE resource_version_seq;
