//! Accounting: GPU-hours and cost from the ledger's attempts (and from work still
//! running), the usage report over them, and team budgets. Pure: the store reads the
//! intervals, this module adds them up.

use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Timelike, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Most budgets one team may declare.
pub const BUDGETS_MAX: usize = 16;
/// Most GPU-hours one budget may allow.
pub const BUDGET_GPU_HOURS_MAX: f64 = 1e9;
/// Highest price per GPU-hour a flavor may carry.
pub const PRICE_MAX: f64 = 1e6;
/// The share of a budget at which it warns.
pub const BUDGET_WARNING: f64 = 0.8;
/// Longest period one report may cover.
pub const REPORT_MAX_DAYS: i64 = 800;
/// Most buckets one report may have (e.g. a month of hours is 744).
pub const REPORT_MAX_BUCKETS: i64 = 5000;
/// Most rows one report may have.
pub const REPORT_MAX_ROWS: usize = 100_000;

/// One attempt's use of GPUs over `[start, end)`: a ledger record, or work still running
/// (then `end` is now).
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    pub team: String,
    /// The team and its ancestors at the time, nearest first.
    pub teams: Vec<String>,
    /// Their uids, in the same order (empty for records from before uids were kept).
    pub team_uids: Vec<Uuid>,
    pub owner: Option<String>,
    pub flavor: String,
    pub cluster: String,
    /// The backend kind: `slurm`, `kubernetes`, `sim`.
    pub backend: String,
    /// The workload kind: `training`, `inference`, `notebook` …
    pub kind: String,
    pub gpus: f64,
    /// Admitted beyond its team's guarantee (the ledger's flag).
    pub flagged: bool,
    /// The part of `gpus` held beyond its team's guarantee: 1 when `flagged`, else 0;
    /// [`settle_borrowed`] makes it the part that was.
    pub borrowed: f64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Per GPU-hour; `None` when its flavor has no price.
    pub price: Option<f64>,
}

impl Interval {
    /// GPU-hours within `[from, to)`.
    pub fn gpu_hours(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
        self.gpus * hours(self.start.max(from), self.end.min(to))
    }
}

/// Names the teams of `intervals` whose name another team (`current`: each team's uid by
/// name, as they are now) has taken since they were deleted `NAME (deleted)`, so that a new
/// team neither takes on an old one's spending nor moves it out from under the old one's
/// parent (a report is keyed by name).
pub fn mark_reused_names(intervals: &mut [Interval], current: &HashMap<String, Uuid>) {
    for i in intervals {
        for (name, uid) in i.teams.iter_mut().zip(&i.team_uids) {
            if current.get(name.as_str()).is_some_and(|now| now != uid) {
                name.push_str(" (deleted)");
            }
        }
        if let Some(first) = i.teams.first().filter(|first| **first != i.team) {
            i.team.clone_from(first);
        }
    }
}

/// Each team's own guarantee of each flavor in GPUs (its guarantee less its child teams',
/// which are theirs), by the team's uid.
pub type GuaranteeGpus = HashMap<(Uuid, String), f64>;

/// From, to, and the share of the flagged GPUs that stays borrowed over it.
type Stretch = (DateTime<Utc>, DateTime<Utc>, f64);

/// Work admitted beyond its team's own guarantee carries `borrowed` for all of its run, but
/// it is borrowed only while the team's own work holds more than that guarantee (of its
/// flavor), as the scheduler counts it: once the team's other work ends, what it holds is
/// within the guarantee again.
/// Settles each interval so flagged: over each stretch of time, the GPUs beyond the
/// guarantee (at most those flagged) stay borrowed, shared among the flagged work in
/// proportion, and the rest count as in quota (averaged over each part of `req` counted
/// apart: a bucket, the period, so an interval within one part keeps one `borrowed` share). An interval not flagged, or whose team is
/// gone or whose subtree the reader may not read (no guarantee in `guarantees`),
/// stays as it is. Each team of `guarantees` must have all its own work in `intervals`.
///
/// Settled in place (a month of a busy site is half a million intervals: copying them, or
/// splitting each in a borrowed and an in-quota piece, took a third of the report's time):
/// an interval cut where its share changes becomes its first piece, and the others are
/// returned.
pub fn settle_borrowed(intervals: &mut [Interval], guarantees: &GuaranteeGpus, req: &ReportRequest) -> Vec<Interval> {
    let guarantees: HashMap<(Uuid, &str), f64> = guarantees.iter().map(|((t, f), g)| ((*t, f.as_str()), *g)).collect();
    // The flagged, by their team and flavor; and every interval of those teams' own work.
    let mut flagged: HashMap<(Uuid, &str), Vec<usize>> = HashMap::new();
    for (k, i) in intervals.iter().enumerate().filter(|(_, i)| i.flagged) {
        if let Some((key, _)) = i.team_uids.first().and_then(|t| guarantees.get_key_value(&(*t, i.flavor.as_str()))) {
            flagged.entry(*key).or_default().push(k);
        }
    }
    if flagged.is_empty() {
        return Vec::new();
    }
    let mut own_work: HashMap<(Uuid, &str), Vec<usize>> = HashMap::new();
    for (k, i) in intervals.iter().enumerate() {
        if let Some((key, _)) = i.team_uids.first().and_then(|t| flagged.get_key_value(&(*t, i.flavor.as_str()))) {
            own_work.entry(*key).or_default().push(k);
        }
    }
    // The parts of each flagged interval, with the share of its GPUs that stays borrowed.
    let mut shares: Vec<(usize, Vec<Stretch>)> = Vec::new();
    for (key, mine) in &flagged {
        let guaranteed = guarantees[key];
        // Changes of the team's own use and of the flagged GPUs, in time. A record that ends
        // before it starts (a backend's clock against Berth's) held nothing.
        let held = |i: &&Interval| i.start < i.end;
        // (The flagged hold all of their GPUs beyond the guarantee as admitted.)
        let mut changes: Vec<(DateTime<Utc>, f64, f64)> =
            Vec::with_capacity(2 * (own_work.get(key).map_or(0, Vec::len) + mine.len()));
        for i in own_work.get(key).into_iter().flatten().map(|&k| &intervals[k]).filter(held) {
            changes.extend([(i.start, i.gpus, 0.0), (i.end, -i.gpus, 0.0)]);
        }
        for i in mine.iter().map(|&k| &intervals[k]).filter(held) {
            changes.extend([(i.start, 0.0, i.gpus), (i.end, 0.0, -i.gpus)]);
        }
        changes.sort_unstable_by_key(|c| c.0);
        let mut stretches: Vec<Stretch> = Vec::new();
        let (mut used, mut borrowed) = (0.0_f64, 0.0_f64);
        for (n, &(at, d_used, d_borrowed)) in changes.iter().enumerate() {
            used += d_used;
            borrowed += d_borrowed;
            let Some(&(next, ..)) = changes.get(n + 1) else { break };
            if next > at && borrowed > 1e-9 {
                let beyond = (used - guaranteed).max(0.0).min(borrowed);
                stretches.push((at, next, (beyond / borrowed).clamp(0.0, 1.0)));
            }
        }
        // The share's hours up to each stretch: any part's average is two lookups.
        let mut before = Vec::with_capacity(stretches.len() + 1);
        before.push(0.0);
        for s in &stretches {
            before.push(before[before.len() - 1] + s.2 * hours(s.0, s.1));
        }
        let up_to = |t: DateTime<Utc>| {
            let k = stretches.partition_point(|s| s.1 <= t);
            before[k] + stretches.get(k).map_or(0.0, |s| s.2 * hours(s.0, t))
        };
        // Each part of a flagged interval the report counts apart (a bucket, the period)
        // gets its average share: exact wherever the report adds up. Neighbours of one
        // share are one piece (a share per change of the team's use made a piece for every
        // change while it ran).
        for &k in mine {
            let i = &intervals[k];
            let mut own: Vec<Stretch> = Vec::new();
            let mut part = i.start;
            while part < i.end {
                let end = boundary_after(req, part).min(i.end);
                let h = hours(part, end);
                let share = if h > 0.0 {
                    ((up_to(end) - up_to(part)) / h).clamp(0.0, 1.0)
                } else {
                    own.last().map_or(1.0, |l| l.2)
                };
                match own.last_mut() {
                    Some(last) if (last.2 - share).abs() < 1e-9 => last.1 = end,
                    _ => own.push((part, end, share)),
                }
                part = end;
            }
            shares.push((k, own));
        }
    }
    // Applied once all are known: a flagged interval is in the subtree of another team's
    // flagged work when that team is above its own.
    let mut more = Vec::new();
    for (k, own) in shares {
        let i = &mut intervals[k];
        let mut pieces = own.into_iter();
        let Some((start, end, borrowed)) = pieces.next() else { continue };
        more.extend(pieces.map(|(start, end, borrowed)| Interval { borrowed, start, end, ..i.clone() }));
        (i.borrowed, i.start, i.end) = (borrowed, start, end);
    }
    more
}

/// The next time after `t` where the report starts counting apart: its period's start
/// and end, and its buckets' within it.
fn boundary_after(req: &ReportRequest, t: DateTime<Utc>) -> DateTime<Utc> {
    if t < req.from {
        req.from
    } else if t < req.to {
        req.bucket.map_or(req.to, |b| req.to.min(b.next(b.floor(t))))
    } else {
        DateTime::<Utc>::MAX_UTC
    }
}

/// Hours from `a` to `b` (0 when `b` is not after `a`).
fn hours(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    if b <= a { 0.0 } else { (b - a).num_milliseconds() as f64 / 3_600_000.0 }
}

/// A report's time buckets (UTC; weeks start on Monday).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Bucket {
    /// For charts of the last hour.
    Minute,
    Hour,
    Day,
    Week,
    Month,
}

impl Bucket {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            _ => return None,
        })
    }

    /// The start of the bucket holding `t`.
    pub fn floor(self, t: DateTime<Utc>) -> DateTime<Utc> {
        let day = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight exists"));
        match self {
            Self::Minute => t.with_nanosecond(0).and_then(|t| t.with_second(0)).expect("valid"),
            Self::Hour => {
                t.with_nanosecond(0).and_then(|t| t.with_second(0)).and_then(|t| t.with_minute(0)).expect("valid")
            }
            Self::Day => day(t.date_naive()),
            Self::Week => day(t.date_naive() - Duration::days(i64::from(t.weekday().num_days_from_monday()))),
            Self::Month => day(t.date_naive().with_day(1).expect("day 1 exists")),
        }
    }

    /// The start of the bucket after the one starting at `start`.
    pub fn next(self, start: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Self::Minute => start + Duration::minutes(1),
            Self::Hour => start + Duration::hours(1),
            Self::Day => start + Duration::days(1),
            Self::Week => start + Duration::days(7),
            Self::Month => {
                let d = start.date_naive();
                let (y, m) = if d.month() == 12 { (d.year() + 1, 1) } else { (d.year(), d.month() + 1) };
                Utc.from_utc_datetime(
                    &NaiveDate::from_ymd_opt(y, m, 1).expect("valid").and_hms_opt(0, 0, 0).expect("valid"),
                )
            }
        }
    }
}

/// What a report's rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    Team,
    Owner,
    Flavor,
    Cluster,
    /// The workload kind (training, inference, notebook …).
    Kind,
    /// The cluster's backend (slurm, kubernetes, sim).
    Backend,
}

impl GroupBy {
    pub const ALL: [Self; 6] = [Self::Team, Self::Owner, Self::Flavor, Self::Cluster, Self::Kind, Self::Backend];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Team => "team",
            Self::Owner => "owner",
            Self::Flavor => "flavor",
            Self::Cluster => "cluster",
            Self::Kind => "kind",
            Self::Backend => "backend",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == s)
    }

    fn of(self, i: &Interval) -> &str {
        match self {
            Self::Team => &i.team,
            Self::Owner => i.owner.as_deref().unwrap_or_default(),
            Self::Flavor => &i.flavor,
            Self::Cluster => &i.cluster,
            Self::Kind => &i.kind,
            Self::Backend => &i.backend,
        }
    }
}

/// GPU-hours and their cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageAmounts {
    pub gpu_hours: f64,
    /// Within the team's guarantee.
    pub in_quota_gpu_hours: f64,
    /// Beyond the team's guarantee: of work admitted beyond it, while the team's subtree
    /// held more than it (to a caller who may not read the whole subtree: as admitted).
    pub borrowed_gpu_hours: f64,
    /// GPU-hours times their flavor's price; GPU-hours of flavors without a price cost
    /// nothing (they are `unpriced_gpu_hours`).
    pub cost: f64,
    /// GPU-hours of flavors without a price: not in `cost`.
    pub unpriced_gpu_hours: f64,
}

impl UsageAmounts {
    /// `borrowed`: the part of them beyond the guarantee.
    fn add(&mut self, gpu_hours: f64, borrowed: f64, price: Option<f64>) {
        self.gpu_hours += gpu_hours;
        if borrowed >= 1.0 {
            self.borrowed_gpu_hours += gpu_hours;
        } else if borrowed <= 0.0 {
            self.in_quota_gpu_hours += gpu_hours;
        } else {
            self.borrowed_gpu_hours += gpu_hours * borrowed;
            self.in_quota_gpu_hours += gpu_hours * (1.0 - borrowed);
        }
        match price {
            Some(p) => self.cost += gpu_hours * p,
            None => self.unpriced_gpu_hours += gpu_hours,
        }
    }
}

/// One row of a report: the bucket (when the report has buckets), the values of the
/// `group_by` dimensions (the others are absent), and the amounts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The subject who submitted the work ("" for work from before owners were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    pub gpu_hours: f64,
    pub in_quota_gpu_hours: f64,
    pub borrowed_gpu_hours: f64,
    pub cost: f64,
    /// GPU-hours of flavors without a price: not in `cost`.
    pub unpriced_gpu_hours: f64,
}

impl UsageRow {
    fn set(&mut self, g: GroupBy, value: String) {
        let field = match g {
            GroupBy::Team => &mut self.team,
            GroupBy::Owner => &mut self.owner,
            GroupBy::Flavor => &mut self.flavor,
            GroupBy::Cluster => &mut self.cluster,
            GroupBy::Kind => &mut self.kind,
            GroupBy::Backend => &mut self.backend,
        };
        *field = Some(value);
    }

    fn get(&self, g: GroupBy) -> Option<&str> {
        match g {
            GroupBy::Team => self.team.as_deref(),
            GroupBy::Owner => self.owner.as_deref(),
            GroupBy::Flavor => self.flavor.as_deref(),
            GroupBy::Cluster => self.cluster.as_deref(),
            GroupBy::Kind => self.kind.as_deref(),
            GroupBy::Backend => self.backend.as_deref(),
        }
    }
}

/// A team's (or department's) totals in a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TeamUsage {
    pub team: String,
    /// Its parent when it last ran work (or now, for a team that ran none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The team's own workloads.
    pub own: UsageAmounts,
    /// The team's and every team's below it: what a department spent. Its borrowed hours
    /// are those beyond the team's own guarantee (for a caller who may read the whole
    /// subtree): what its teams borrowed within it, from each other, is in quota.
    pub subtree: UsageAmounts,
    /// GPU-hours its guarantees (today's, all flavors) stood for over the period, from when
    /// the team was created until now at the latest; absent for a caller who may not read
    /// its whole subtree (a member of a department: whether the guarantee sat idle depends
    /// on teams below it; a member of a team with none below it sees it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guaranteed_gpu_hours: Option<f64>,
    /// Of those, the GPU-hours its subtree did not use; absent as the above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_guarantee_gpu_hours: Option<f64>,
}

/// `GET /api/v1/usage/report`: GPU-hours and cost over `[from, to)`, of the work the
/// caller may read; work still running counts up to now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<Bucket>,
    pub group_by: Vec<GroupBy>,
    pub totals: UsageAmounts,
    /// By bucket (oldest first), then by the `group_by` values.
    pub rows: Vec<UsageRow>,
    /// Every team with usage or a guarantee in the period, by name.
    pub teams: Vec<TeamUsage>,
}

/// A team's guarantee of one flavor, for the idle-guarantee figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Guarantee {
    pub team: String,
    pub uid: Uuid,
    pub parent: Option<String>,
    pub flavor: String,
    pub gpus: f64,
    /// When the team was created: nothing was guaranteed before.
    pub since: DateTime<Utc>,
}

/// What a report asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRequest {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: Vec<GroupBy>,
    pub bucket: Option<Bucket>,
}

/// Whose totals a reader sees, by team uid (a deleted team's name may be taken again).
#[derive(Debug, Clone, Default)]
pub enum Visibility {
    #[default]
    All,
    /// `teams` (as they are now) and any team that was (or was below) one of `covering`.
    Some { teams: BTreeSet<Uuid>, covering: BTreeSet<Uuid> },
}

impl Visibility {
    /// Whether the team at `depth` of `i`'s chain is shown.
    fn shows(&self, i: &Interval, depth: usize) -> bool {
        match self {
            Self::All => true,
            Self::Some { teams, covering } => i
                .team_uids
                .get(depth)
                .is_some_and(|t| teams.contains(t) || i.team_uids[depth..].iter().any(|a| covering.contains(a))),
        }
    }
}

/// The report over `intervals` (already limited to what the caller may read and to those
/// touching the period). `guarantees` are those of `guaranteed`, the teams whose whole
/// subtree the caller may read (the others' guarantees are not shown); `shown` says which
/// teams' totals the caller may see; `now` ends the idle guarantee (the future is not idle
/// yet).
pub fn report<'a>(
    req: &ReportRequest,
    intervals: impl IntoIterator<Item = &'a Interval>,
    guarantees: &[Guarantee],
    guaranteed: &BTreeSet<String>,
    shown: &Visibility,
    now: DateTime<Utc>,
) -> UsageReport {
    // Keyed by borrowed names (a month of a busy site is half a million intervals): rows
    // by bucket and group values, teams by name, sorted once at the end.
    let mut rows: HashMap<RowKey, UsageRow> = HashMap::new();
    let mut totals = UsageAmounts::default();
    let mut teams: HashMap<&str, TeamUsage> = HashMap::new();
    // What each team's subtree borrowed, by flavor: a guarantee caps its own flavor's only.
    let mut subtree_borrowed: HashMap<(&str, &str), f64> = HashMap::new();
    let new_team = |name: &str| TeamUsage { team: name.to_owned(), ..TeamUsage::default() };
    // Who uses each guaranteed (team, flavor): the team's subtree.
    let mut users: HashMap<(Uuid, &str), Vec<&Interval>> =
        guarantees.iter().map(|g| ((g.uid, g.flavor.as_str()), Vec::new())).collect();
    for i in intervals {
        let whole = i.gpu_hours(req.from, req.to);
        for t in &i.team_uids {
            if let Some(u) = users.get_mut(&(*t, i.flavor.as_str())) {
                u.push(i);
            }
        }
        if whole <= 0.0 {
            continue;
        }
        totals.add(whole, i.borrowed, i.price);
        for (depth, t) in i.teams.iter().enumerate() {
            if !shown.shows(i, depth) {
                continue;
            }
            let e = teams.entry(t.as_str()).or_insert_with(|| new_team(t));
            if e.parent.is_none() {
                e.parent = i.teams.get(depth + 1).cloned();
            }
            if depth == 0 {
                e.own.add(whole, i.borrowed, i.price);
            }
            e.subtree.add(whole, i.borrowed, i.price);
            *subtree_borrowed.entry((t.as_str(), i.flavor.as_str())).or_default() += whole * i.borrowed.clamp(0.0, 1.0);
        }
        let key: Vec<&str> = req.group_by.iter().map(|g| g.of(i)).collect();
        for (bucket, from, to) in slices(req, i) {
            let mut a = UsageAmounts::default();
            a.add(i.gpus * hours(from, to), i.borrowed, i.price);
            let row = match rows.get_mut(&(bucket, key.clone())) {
                Some(row) => row,
                None => {
                    let mut r = UsageRow { bucket, ..UsageRow::default() };
                    for (g, v) in req.group_by.iter().zip(&key) {
                        r.set(*g, (*v).to_owned());
                    }
                    rows.entry((bucket, key.clone())).or_insert(r)
                }
            };
            row.gpu_hours += a.gpu_hours;
            row.in_quota_gpu_hours += a.in_quota_gpu_hours;
            row.borrowed_gpu_hours += a.borrowed_gpu_hours;
            row.cost += a.cost;
            row.unpriced_gpu_hours += a.unpriced_gpu_hours;
        }
    }
    // A team's subtree borrowed beyond the team's own guarantee only: work of the teams below
    // it that each borrowed within it (a sibling's idle guarantee) is the department's in
    // quota (a department holding 44 GPUs against 28 reported 24 borrowed, its teams' sum).
    // (A team with no work below it borrowed what its own work did, settled against its
    // guarantee; a department's own work alone is settled against its own guarantee, less
    // than the subtree's, so it is capped too.)
    let departments: HashSet<&str> = guarantees.iter().filter_map(|g| g.parent.as_deref()).collect();
    for g in guarantees {
        let Some(used) = users.get(&(g.uid, g.flavor.as_str())) else { continue };
        if !departments.contains(g.team.as_str()) && used.iter().all(|i| i.team_uids.first() == Some(&g.uid)) {
            continue;
        }
        let e = teams.entry(g.team.as_str()).or_insert_with(|| new_team(&g.team));
        // Of this flavor only: capped by the sum over all flavors, a department with a
        // guarantee of another flavor it did not use reported nothing borrowed at all.
        let borrowed = subtree_borrowed.get(&(g.team.as_str(), g.flavor.as_str())).copied().unwrap_or(0.0);
        let over = (borrowed - beyond(g.gpus, used, req.from, req.to)).max(0.0).min(e.subtree.borrowed_gpu_hours);
        e.subtree.borrowed_gpu_hours -= over;
        e.subtree.in_quota_gpu_hours += over;
    }
    for g in guarantees.iter().filter(|g| g.gpus > 0.0) {
        let (from, to) = (req.from.max(g.since), req.to.min(now));
        if to <= from {
            continue;
        }
        let used = users.get(&(g.uid, g.flavor.as_str())).into_iter().flatten().copied();
        let e = teams.entry(g.team.as_str()).or_insert_with(|| new_team(&g.team));
        if e.parent.is_none() {
            e.parent.clone_from(&g.parent);
        }
        *e.guaranteed_gpu_hours.get_or_insert(0.0) += g.gpus * hours(from, to);
        *e.idle_guarantee_gpu_hours.get_or_insert(0.0) += idle(g.gpus, used, from, to);
    }
    for t in teams.values_mut().filter(|t| guaranteed.contains(&t.team)) {
        t.guaranteed_gpu_hours.get_or_insert(0.0);
        t.idle_guarantee_gpu_hours.get_or_insert(0.0);
    }
    let mut rows: Vec<(RowKey, UsageRow)> = rows.into_iter().collect();
    rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut teams: Vec<TeamUsage> = teams.into_values().collect();
    teams.sort_unstable_by(|a, b| a.team.cmp(&b.team));
    UsageReport {
        from: req.from,
        to: req.to,
        bucket: req.bucket,
        group_by: req.group_by.clone(),
        totals,
        rows: rows.into_iter().map(|(_, r)| r).collect(),
        teams,
    }
}

/// A row's bucket and its `group_by` values.
type RowKey<'a> = (Option<DateTime<Utc>>, Vec<&'a str>);

/// A bucket's start (`None`: the report has no buckets) and the part of it an interval
/// covers.
type Slice = (Option<DateTime<Utc>>, DateTime<Utc>, DateTime<Utc>);

/// The parts of `i` within the report's period, one per bucket it touches.
fn slices(req: &ReportRequest, i: &Interval) -> Vec<Slice> {
    let (from, to) = (i.start.max(req.from), i.end.min(req.to));
    let Some(b) = req.bucket else { return vec![(None, from, to)] };
    let mut out = Vec::new();
    let mut start = b.floor(from);
    while start < to {
        let next = b.next(start);
        out.push((Some(start), start.max(from), next.min(to)));
        start = next;
    }
    out
}

/// GPU-hours of `guaranteed` GPUs left unused over `[from, to)` by `used`: the integral
/// of `max(0, guaranteed − in use)`.
fn idle<'a>(guaranteed: f64, used: impl Iterator<Item = &'a Interval>, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let mut changes: Vec<(DateTime<Utc>, f64)> = Vec::new();
    for i in used {
        let (a, b) = (i.start.max(from), i.end.min(to));
        if a < b {
            changes.push((a, i.gpus));
            changes.push((b, -i.gpus));
        }
    }
    changes.sort_by_key(|c| c.0);
    let (mut at, mut in_use, mut total) = (from, 0.0_f64, 0.0);
    for (t, delta) in changes {
        total += (guaranteed - in_use).max(0.0) * hours(at, t);
        at = t;
        in_use += delta;
    }
    total + (guaranteed - in_use).max(0.0) * hours(at, to)
}

/// GPU-hours of `used` (a team's subtree) beyond `guaranteed` within `[from, to)`, at most
/// the GPUs admitted beyond a guarantee (`flagged`) at each time.
fn beyond(guaranteed: f64, used: &[&Interval], from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let mut changes: Vec<(DateTime<Utc>, f64, f64)> = Vec::with_capacity(2 * used.len());
    for i in used {
        let (a, b) = (i.start.max(from), i.end.min(to));
        let flagged = if i.flagged { i.gpus } else { 0.0 };
        if a < b {
            changes.push((a, i.gpus, flagged));
            changes.push((b, -i.gpus, -flagged));
        }
    }
    changes.sort_unstable_by_key(|c| c.0);
    let (mut at, mut held, mut flagged, mut total) = (from, 0.0_f64, 0.0_f64, 0.0);
    for (t, d_held, d_flagged) in changes {
        total += (held - guaranteed).max(0.0).min(flagged.max(0.0)) * hours(at, t);
        (at, held, flagged) = (t, held + d_held, flagged + d_flagged);
    }
    total
}

/// The report as CSV: a header, then one line per row (the bucket first when there are
/// buckets, then the `group_by` columns, then the amounts).
pub fn report_csv(r: &UsageReport) -> String {
    let mut out = String::new();
    let mut header: Vec<&str> = Vec::new();
    if r.bucket.is_some() {
        header.push("bucket");
    }
    header.extend(r.group_by.iter().map(|g| g.as_str()));
    header.extend(["gpu_hours", "in_quota_gpu_hours", "borrowed_gpu_hours", "cost", "unpriced_gpu_hours"]);
    out.push_str(&header.join(","));
    out.push('\n');
    for row in &r.rows {
        let mut cells: Vec<String> = Vec::new();
        if r.bucket.is_some() {
            cells.push(row.bucket.map(|b| b.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_default());
        }
        cells.extend(r.group_by.iter().map(|g| csv_cell(row.get(*g).unwrap_or(""))));
        cells.extend(
            [row.gpu_hours, row.in_quota_gpu_hours, row.borrowed_gpu_hours, row.cost, row.unpriced_gpu_hours]
                .map(|x| format!("{x:.6}")),
        );
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// A CSV cell: quoted when it holds a comma, quote or line break; a leading `=`, `+`, `-`,
/// `@`, tab or carriage return is prefixed with `'` so a spreadsheet does not run it as a
/// formula (OWASP's advice for CSV injection).
fn csv_cell(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{s}") } else { s.to_owned() };
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s }
}

/// A budget's period: calendar weeks (from Monday 00:00 UTC) or months.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetPeriod {
    Week,
    Month,
}

impl BudgetPeriod {
    fn bucket(self) -> Bucket {
        match self {
            Self::Week => Bucket::Week,
            Self::Month => Bucket::Month,
        }
    }

    /// The period holding `t`: its start and when it resets.
    pub fn around(self, t: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let start = self.bucket().floor(t);
        (start, self.bucket().next(start))
    }
}

/// What crossing a budget does. Nothing running is ever stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetAction {
    /// Events and metrics only.
    #[default]
    Warn,
    /// New work runs only within the team's guarantee until the period resets.
    StopBorrowing,
    /// No new work starts until the period resets.
    StopNew,
}

impl BudgetAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warn => "warn",
            Self::StopBorrowing => "stop_borrowing",
            Self::StopNew => "stop_new",
        }
    }
}

/// GPU-hours a team's subtree may use per period, of one flavor or of all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Only this flavor's GPU-hours; all flavors' when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "h100-80gb", pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub flavor: Option<String>,
    #[schema(example = 5000, minimum = 0, maximum = 1_000_000_000)]
    pub gpu_hours: f64,
    pub period: BudgetPeriod,
    #[serde(default)]
    pub action: BudgetAction,
}

impl Budget {
    /// Its name in messages: `5000 GPU-hours of h100-80gb per month`.
    pub fn describe(&self) -> String {
        let period = match self.period {
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
        };
        let unit = if self.gpu_hours == 1.0 { "GPU-hour" } else { "GPU-hours" };
        format!("{} {unit} of {} per {period}", self.gpu_hours, self.flavor.as_deref().unwrap_or("all flavors"))
    }

    /// Whether usage of `flavor` counts against it.
    pub fn covers(&self, flavor: &str) -> bool {
        self.flavor.as_deref().is_none_or(|f| f == flavor)
    }

    /// GPU-hours counting against it, of `by_flavor` (the team's subtree's use in the
    /// current period, per flavor).
    pub fn used(&self, by_flavor: &[(&str, f64)]) -> f64 {
        by_flavor.iter().filter(|(f, _)| self.covers(f)).map(|(_, h)| h).sum()
    }
}

/// Where a budget stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetState {
    #[default]
    Ok,
    /// At least 80 % used.
    Warning,
    /// All used: its action holds until it resets.
    Exhausted,
}

impl BudgetState {
    pub fn of(used: f64, allowed: f64) -> Self {
        if used >= allowed {
            Self::Exhausted
        } else if used >= BUDGET_WARNING * allowed {
            Self::Warning
        } else {
            Self::Ok
        }
    }
}

/// A budget's use in its current period (`status.budgets`, one per `spec.budgets` entry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetStatus {
    /// The budget as declared.
    pub budget: Budget,
    pub used_gpu_hours: f64,
    pub state: BudgetState,
    pub period_start: DateTime<Utc>,
    pub resets_at: DateTime<Utc>,
    /// When this was computed.
    pub updated_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// A team's uid, the same for the same name (a name taken again is given another).
    fn uid(name: &str) -> Uuid {
        Uuid::from_u128(name.bytes().fold(7, |h: u128, b| h.wrapping_mul(131).wrapping_add(u128::from(b))))
    }

    fn run(team: &str, chain: &[&str], owner: &str, gpus: f64, start: &str, end: &str) -> Interval {
        Interval {
            team: team.into(),
            teams: chain.iter().map(|s| (*s).to_owned()).collect(),
            team_uids: chain.iter().map(|s| uid(s)).collect(),
            owner: Some(owner.into()),
            flavor: "h100".into(),
            cluster: "alpha".into(),
            backend: "slurm".into(),
            kind: "training".into(),
            gpus,
            flagged: false,
            borrowed: 0.0,
            start: t(start),
            end: t(end),
            price: Some(2.0),
        }
    }

    #[test]
    fn a_deleted_teams_spending_stays_its_own_when_its_name_is_taken_again() {
        // nlp (under research) ran 2 GPU-hours, was deleted, and a new nlp was made at the top.
        let mut old =
            vec![run("nlp", &["nlp", "research"], "alice", 2.0, "2026-11-01T01:00:00Z", "2026-11-01T02:00:00Z")];
        let current = HashMap::from([("nlp".to_owned(), Uuid::from_u128(1)), ("research".to_owned(), uid("research"))]);
        mark_reused_names(&mut old, &current);
        assert_eq!(
            (old[0].team.as_str(), old[0].teams.as_slice()),
            ("nlp (deleted)", &["nlp (deleted)".to_owned(), "research".to_owned()][..])
        );
        let req = ReportRequest {
            from: t("2026-11-01T00:00:00Z"),
            to: t("2026-11-02T00:00:00Z"),
            group_by: vec![GroupBy::Team],
            bucket: None,
        };
        let r = report(&req, &old, &[], &BTreeSet::new(), &Visibility::All, t("2026-11-02T00:00:00Z"));
        assert_eq!(r.rows[0].team.as_deref(), Some("nlp (deleted)"));
        let gone = r.teams.iter().find(|t| t.team == "nlp (deleted)").unwrap();
        assert_eq!(gone.parent.as_deref(), Some("research"), "still under the parent it had");
        assert!(r.teams.iter().all(|t| t.team != "nlp"), "the new nlp has spent nothing");
        // A team whose name nobody took again keeps it.
        let mut kept = vec![run("nlp", &["nlp"], "alice", 2.0, "2026-11-01T01:00:00Z", "2026-11-01T02:00:00Z")];
        mark_reused_names(&mut kept, &HashMap::from([("nlp".to_owned(), uid("nlp"))]));
        assert_eq!(kept[0].team, "nlp");
        mark_reused_names(&mut kept, &HashMap::new());
        assert_eq!(kept[0].team, "nlp");
    }

    /// nlp is guaranteed 8. bob's 4 GPUs were admitted beyond it (10:00–14:00) while
    /// alice held 8 (09:00–11:00); a child team's 2 (12:00–13:00) are not nlp's own;
    /// carol's 2, also flagged (10:30–11:30), share what is beyond. Borrowed: 10:00–10:30
    /// 4 (of 12 held), 10:30–11:00 6 of 14 (bob 4, carol 2, both wholly), 11:00–11:30 0
    /// (6 held), then nothing; the rest of the flagged hours count in quota.
    fn settle(mut intervals: Vec<Interval>, guarantees: &GuaranteeGpus, req: &ReportRequest) -> Vec<Interval> {
        let more = settle_borrowed(&mut intervals, guarantees, req);
        intervals.extend(more);
        intervals
    }

    #[test]
    fn work_flagged_borrowed_is_borrowed_only_while_its_team_holds_more_than_its_guarantee() {
        let flagged = |mut i: Interval| {
            (i.flagged, i.borrowed) = (true, 1.0);
            i
        };
        let intervals = vec![
            run("nlp", &["nlp", "research"], "alice", 8.0, "2026-11-01T09:00:00Z", "2026-11-01T11:00:00Z"),
            flagged(run("nlp", &["nlp", "research"], "bob", 4.0, "2026-11-01T10:00:00Z", "2026-11-01T14:00:00Z")),
            flagged(run("nlp", &["nlp", "research"], "carol", 2.0, "2026-11-01T10:30:00Z", "2026-11-01T11:30:00Z")),
            run("sub", &["sub", "nlp", "research"], "dan", 2.0, "2026-11-01T12:00:00Z", "2026-11-01T13:00:00Z"),
            // Another team's flagged work, whose team is gone: stays as it was.
            flagged(run("gone", &["gone"], "eve", 1.0, "2026-11-01T10:00:00Z", "2026-11-01T12:00:00Z")),
        ];
        let guarantees = GuaranteeGpus::from([((uid("nlp"), "h100".to_owned()), 8.0)]);
        let (from, to) = (t("2026-11-01T00:00:00Z"), t("2026-11-02T00:00:00Z"));
        let mut req = ReportRequest { from, to, group_by: vec![GroupBy::Owner], bucket: None };
        let settled = settle(intervals.clone(), &guarantees, &req);
        // One part (the period): bob's run stays one interval, a quarter of it borrowed.
        let bob: Vec<(f64, f64)> =
            settled.iter().filter(|i| i.owner.as_deref() == Some("bob")).map(|i| (i.gpus, i.borrowed)).collect();
        assert_eq!(bob, [(4.0, 0.25)], "{settled:#?}");
        let sum = |owner: &str, borrowed: bool| -> f64 {
            settled
                .iter()
                .filter(|i| i.owner.as_deref() == Some(owner))
                .map(|i| i.gpu_hours(from, to) * if borrowed { i.borrowed } else { 1.0 - i.borrowed })
                .sum()
        };
        // bob: 4 × 0.5 h + 4 × 0.5 h borrowed; the other 3 h in quota.
        assert!((sum("bob", true) - 4.0).abs() < 1e-9, "{settled:#?}");
        assert!((sum("bob", false) - 12.0).abs() < 1e-9);
        // carol: 2 × 0.5 h borrowed, 2 × 0.5 h in quota.
        assert!((sum("carol", true) - 1.0).abs() < 1e-9 && (sum("carol", false) - 1.0).abs() < 1e-9);
        assert!((sum("alice", false) - 16.0).abs() < 1e-9 && sum("alice", true) == 0.0);
        assert!((sum("eve", true) - 2.0).abs() < 1e-9, "no guarantee known: the flag stands");
        // Nothing is lost or made: the GPU-hours, the cost and the GPUs held at any time.
        let total = |v: &[Interval]| v.iter().map(|i| i.gpu_hours(from, to)).sum::<f64>();
        assert!((total(&settled) - total(&intervals)).abs() < 1e-9);
        // By the hour: bob's borrowed hours all fall in the 10:00 bucket.
        req.bucket = Some(Bucket::Hour);
        let settled = settle(intervals.clone(), &guarantees, &req);
        let r = report(&req, &settled, &[], &BTreeSet::new(), &Visibility::All, to);
        let bob: Vec<(u32, f64, f64)> = r
            .rows
            .iter()
            .filter(|r| r.owner.as_deref() == Some("bob"))
            .map(|r| (r.bucket.unwrap().hour(), r.borrowed_gpu_hours, r.in_quota_gpu_hours))
            .collect();
        assert_eq!(bob, [(10, 4.0, 0.0), (11, 0.0, 4.0), (12, 0.0, 4.0), (13, 0.0, 4.0)]);
        // A run flagged 30 days before a report of the last hour by the minute stays a few
        // pieces (a piece a minute of its run before the period made 43,000), and a record
        // that ends before it starts changes nothing.
        let long = flagged(run("nlp", &["nlp"], "bob", 12.0, "2026-10-02T00:00:00Z", "2026-11-01T23:30:00Z"));
        let backwards = run("nlp", &["nlp"], "alice", 8.0, "2026-11-01T23:50:00Z", "2026-11-01T23:10:00Z");
        let late =
            ReportRequest { from: t("2026-11-01T23:00:00Z"), to, group_by: vec![], bucket: Some(Bucket::Minute) };
        let settled = settle(vec![long, backwards], &guarantees, &late);
        let bob: Vec<&Interval> = settled.iter().filter(|i| i.owner.as_deref() == Some("bob")).collect();
        let pieces: Vec<(f64, f64)> = bob.iter().map(|i| (i.borrowed, i.gpus)).collect();
        assert_eq!(pieces, [(1.0 / 3.0, 12.0)], "12 GPUs against 8 all along: {bob:#?}");
        // Within the guarantee all along: nothing stays borrowed.
        let alone = vec![flagged(run("nlp", &["nlp"], "bob", 2.0, "2026-11-01T10:00:00Z", "2026-11-01T13:00:00Z"))];
        req.bucket = None;
        let settled = settle(alone, &guarantees, &req);
        assert_eq!(settled.len(), 1);
        assert!(settled[0].borrowed == 0.0 && settled[0].gpus == 2.0);
    }

    #[test]
    fn a_departments_subtree_borrows_only_beyond_its_guarantee_when_only_its_own_work_ran() {
        // Found from outside: research (guaranteed 16; nlp below it 8, so 8 its own) ran 12
        // GPUs of its own, 4 beyond its own guarantee, and nothing below it: its subtree
        // reported those 4 as borrowed, while the subtree held 12 of its 16 (once nlp ran a
        // 1-GPU job, the same hours were not borrowed).
        let mut own = run("research", &["research"], "rita", 12.0, "2026-11-01T10:00:00Z", "2026-11-01T11:00:00Z");
        (own.flagged, own.borrowed) = (true, 1.0);
        let req = ReportRequest {
            from: t("2026-11-01T00:00:00Z"),
            to: t("2026-11-02T00:00:00Z"),
            group_by: vec![GroupBy::Team],
            bucket: None,
        };
        let guarantees = GuaranteeGpus::from([((uid("research"), "h100".to_owned()), 8.0)]);
        let settled = settle(vec![own], &guarantees, &req);
        let since = t("2026-10-01T00:00:00Z");
        let guarantee = |team: &str, parent: Option<&str>, gpus: f64| Guarantee {
            team: team.into(),
            uid: uid(team),
            parent: parent.map(str::to_owned),
            flavor: "h100".into(),
            gpus,
            since,
        };
        let all = [guarantee("research", None, 16.0), guarantee("nlp", Some("research"), 8.0)];
        let shown = BTreeSet::from(["research".to_owned(), "nlp".to_owned()]);
        let r = report(&req, &settled, &all, &shown, &Visibility::All, t("2026-11-05T00:00:00Z"));
        let research = r.teams.iter().find(|t| t.team == "research").unwrap();
        assert_eq!((research.own.borrowed_gpu_hours, research.subtree.borrowed_gpu_hours), (4.0, 0.0), "{research:?}");
    }

    #[test]
    fn gpu_hours_of_a_flavor_without_a_price_are_said_apart_not_priced_at_nothing() {
        // A cost of 0.0 for them read as free to a manager; 0.0 beside priced work was
        // silently short.
        let priced = run("nlp", &["nlp", "research"], "alice", 4.0, "2026-11-01T00:00:00Z", "2026-11-01T03:00:00Z");
        let mut unpriced = run("nlp", &["nlp", "research"], "bob", 2.0, "2026-11-01T00:00:00Z", "2026-11-01T05:00:00Z");
        unpriced.price = None;
        let req = ReportRequest {
            from: t("2026-11-01T00:00:00Z"),
            to: t("2026-11-02T00:00:00Z"),
            group_by: vec![GroupBy::Owner],
            bucket: None,
        };
        let shown = BTreeSet::from(["nlp".to_owned()]);
        let r = report(&req, &[priced, unpriced], &[], &shown, &Visibility::All, t("2026-11-05T00:00:00Z"));
        assert_eq!((r.totals.gpu_hours, r.totals.cost, r.totals.unpriced_gpu_hours), (22.0, 24.0, 10.0));
        let bob = r.rows.iter().find(|row| row.owner.as_deref() == Some("bob")).unwrap();
        assert_eq!((bob.cost, bob.unpriced_gpu_hours), (0.0, 10.0));
        let nlp = r.teams.iter().find(|t| t.team == "nlp").unwrap();
        assert_eq!(nlp.subtree.unpriced_gpu_hours, 10.0);
        let csv = report_csv(&r);
        assert!(
            csv.starts_with("owner,gpu_hours,in_quota_gpu_hours,borrowed_gpu_hours,cost,unpriced_gpu_hours\n"),
            "{csv}"
        );
        assert!(csv.contains("bob,10.000000,10.000000,0.000000,0.000000,10.000000\n"), "{csv}");
    }

    #[test]
    fn buckets_split_work_that_crosses_a_boundary() {
        // 4 GPUs from 22:30 to 01:30: 1.5 h on the 1st, 1.5 h on the 2nd.
        let i = run("nlp", &["nlp", "research"], "alice", 4.0, "2026-11-01T22:30:00Z", "2026-11-02T01:30:00Z");
        let req = ReportRequest {
            from: t("2026-11-01T00:00:00Z"),
            to: t("2026-11-03T00:00:00Z"),
            group_by: vec![GroupBy::Team],
            bucket: Some(Bucket::Day),
        };
        let shown = BTreeSet::from(["nlp".to_owned()]);
        let r = report(&req, &[i], &[], &shown, &Visibility::All, t("2026-11-05T00:00:00Z"));
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].bucket, Some(t("2026-11-01T00:00:00Z")));
        assert!((r.rows[0].gpu_hours - 6.0).abs() < 1e-9);
        assert!((r.rows[1].gpu_hours - 6.0).abs() < 1e-9);
        assert!((r.totals.cost - 24.0).abs() < 1e-9);
        let research = r.teams.iter().find(|t| t.team == "research").unwrap();
        assert!((research.subtree.gpu_hours - 12.0).abs() < 1e-9);
        assert_eq!(research.own.gpu_hours, 0.0);
        let nlp = r.teams.iter().find(|t| t.team == "nlp").unwrap();
        assert_eq!(nlp.parent.as_deref(), Some("research"));
        // nlp's guarantee is shown (none), research's is not.
        assert_eq!((nlp.guaranteed_gpu_hours, nlp.idle_guarantee_gpu_hours), (Some(0.0), Some(0.0)));
        assert_eq!((research.guaranteed_gpu_hours, research.idle_guarantee_gpu_hours), (None, None));
    }

    #[test]
    fn the_period_clips_work_and_idle_guarantee_integrates_the_gap() {
        // Guaranteed 8 from 00:00 to 04:00 (now); 4 GPUs used 01:00–03:00, 8 GPUs 03:00–05:00.
        let a = run("nlp", &["nlp"], "alice", 4.0, "2026-11-01T01:00:00Z", "2026-11-01T03:00:00Z");
        let b = run("nlp", &["nlp"], "bob", 8.0, "2026-11-01T03:00:00Z", "2026-11-01T05:00:00Z");
        let req = ReportRequest {
            from: t("2026-11-01T00:00:00Z"),
            to: t("2026-11-01T06:00:00Z"),
            group_by: vec![GroupBy::Owner],
            bucket: None,
        };
        let g = Guarantee {
            team: "nlp".into(),
            uid: uid("nlp"),
            parent: None,
            flavor: "h100".into(),
            gpus: 8.0,
            since: t("2026-10-01T00:00:00Z"),
        };
        let r =
            report(&req, &[a, b], &[g], &BTreeSet::from(["nlp".into()]), &Visibility::All, t("2026-11-01T04:00:00Z"));
        assert_eq!(r.rows.len(), 2);
        assert!((r.totals.gpu_hours - (8.0 + 16.0)).abs() < 1e-9);
        let nlp = &r.teams[0];
        assert_eq!(nlp.guaranteed_gpu_hours, Some(32.0));
        // 8 idle for 1 h, 4 idle for 2 h, 0 for the last hour.
        assert_eq!(nlp.idle_guarantee_gpu_hours, Some(16.0));
    }

    /// research (guaranteed 8) over nlp (4) and vision (4). 10:00–11:00 nlp holds 6 (2
    /// borrowed beyond its 4), vision 2: research holds 8, its guarantee, so nothing is
    /// borrowed for it. 11:00–12:00 vision holds 4 too: research holds 10, 2 beyond.
    #[test]
    fn a_department_borrows_only_beyond_its_own_guarantee() {
        let mut lent = run("nlp", &["nlp", "research"], "nina", 2.0, "2026-11-01T10:00:00Z", "2026-11-01T12:00:00Z");
        (lent.flagged, lent.borrowed) = (true, 1.0);
        let intervals = [
            run("nlp", &["nlp", "research"], "ned", 4.0, "2026-11-01T10:00:00Z", "2026-11-01T12:00:00Z"),
            lent,
            run("vision", &["vision", "research"], "vic", 2.0, "2026-11-01T10:00:00Z", "2026-11-01T11:00:00Z"),
            run("vision", &["vision", "research"], "val", 4.0, "2026-11-01T11:00:00Z", "2026-11-01T12:00:00Z"),
        ];
        let g = |team: &str, parent: Option<&str>, gpus: f64| Guarantee {
            team: team.into(),
            uid: uid(team),
            parent: parent.map(Into::into),
            flavor: "h100".into(),
            gpus,
            since: t("2026-10-01T00:00:00Z"),
        };
        let guarantees =
            [g("research", None, 8.0), g("nlp", Some("research"), 4.0), g("vision", Some("research"), 4.0)];
        let req = ReportRequest {
            from: t("2026-11-01T00:00:00Z"),
            to: t("2026-11-02T00:00:00Z"),
            group_by: vec![GroupBy::Team],
            bucket: None,
        };
        let all = BTreeSet::from(["research".into(), "nlp".into(), "vision".into()]);
        let r = report(&req, &intervals, &guarantees, &all, &Visibility::All, req.to);
        let team = |name: &str| r.teams.iter().find(|t| t.team == name).unwrap().subtree;
        // nlp borrowed 2 GPUs for 2 h beyond its own 4; research only 2 GPUs for the second hour.
        assert_eq!((team("nlp").borrowed_gpu_hours, team("nlp").in_quota_gpu_hours), (4.0, 8.0));
        assert_eq!((team("research").borrowed_gpu_hours, team("research").in_quota_gpu_hours), (2.0, 16.0));
        assert_eq!(team("research").gpu_hours, 18.0);
        // Rows and totals count each work's borrowing against its own team's guarantee.
        assert_eq!(r.totals.borrowed_gpu_hours, 4.0);
    }

    /// A department guaranteed a100 and l4, whose team borrows a100 beyond it and uses no
    /// l4: the unused l4 guarantee caps nothing of a100 (the cap of each guarantee took the
    /// borrowing of every flavor, so the unused one left 0 borrowed); lab2, guaranteed a100
    /// alone, reads the same.
    #[test]
    fn a_departments_unused_guarantee_of_another_flavor_hides_none_of_its_borrowing() {
        let mut reports = Vec::new();
        for (dept, l4) in [("lab1", Some(2.0)), ("lab2", None)] {
            let team = format!("{dept}-a");
            let mut lent = run(&team, &[&team, dept], "ann", 2.0, "2026-11-01T10:00:00Z", "2026-11-01T11:00:00Z");
            (lent.flagged, lent.borrowed, lent.flavor) = (true, 1.0, "a100".into());
            let mut own = run(&team, &[&team, dept], "ann", 2.0, "2026-11-01T10:00:00Z", "2026-11-01T11:00:00Z");
            own.flavor = "a100".into();
            let g = |team: &str, parent: Option<&str>, flavor: &str, gpus: f64| Guarantee {
                team: team.into(),
                uid: uid(team),
                parent: parent.map(Into::into),
                flavor: flavor.into(),
                gpus,
                since: t("2026-10-01T00:00:00Z"),
            };
            let mut guarantees = vec![g(dept, None, "a100", 2.0), g(&team, Some(dept), "a100", 2.0)];
            guarantees.extend(l4.map(|gpus| g(dept, None, "l4", gpus)));
            let req = ReportRequest {
                from: t("2026-11-01T00:00:00Z"),
                to: t("2026-11-02T00:00:00Z"),
                group_by: vec![GroupBy::Team],
                bucket: None,
            };
            let all = BTreeSet::from([dept.to_owned(), team.clone()]);
            let r = report(&req, &[own, lent], &guarantees, &all, &Visibility::All, req.to);
            let subtree = r.teams.iter().find(|t| t.team == dept).unwrap().subtree;
            reports.push((subtree.borrowed_gpu_hours, subtree.in_quota_gpu_hours));
        }
        assert_eq!(reports, [(2.0, 2.0), (2.0, 2.0)], "4 a100 held against 2 guaranteed for an hour");
    }

    #[test]
    fn months_and_weeks_start_where_calendars_do() {
        assert_eq!(Bucket::Week.floor(t("2026-11-26T13:00:00Z")), t("2026-11-23T00:00:00Z"));
        assert_eq!(Bucket::Month.next(t("2026-12-01T00:00:00Z")), t("2027-01-01T00:00:00Z"));
        assert_eq!(BudgetPeriod::Month.around(t("2026-02-14T10:00:00Z")).1, t("2026-03-01T00:00:00Z"));
    }

    #[test]
    fn csv_quotes_and_defuses_cells() {
        let r = UsageReport {
            group_by: vec![GroupBy::Owner],
            rows: vec![UsageRow { owner: Some("=cmd,x".into()), gpu_hours: 1.0, ..UsageRow::default() }],
            ..UsageReport::default()
        };
        let csv = report_csv(&r);
        assert_eq!(csv.lines().nth(1).unwrap(), "\"'=cmd,x\",1.000000,0.000000,0.000000,0.000000,0.000000");
    }
}
