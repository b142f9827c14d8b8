//! Leaves out the names a reader may not see.
//!
//! The scheduler and controllers write what they decided in words that name the teams and
//! workloads involved ("waiting for vision/train-3 to stop", "team vision reclaims its
//! guarantee"), so that a platform admin reading a status knows whom it is about. A member
//! of another team reading the same status must learn *that* it waits for reclaim, never
//! *whose* work it is: every name of a team the reader cannot read, alone or as
//! `team/workload`, becomes "another team" (or "an ancestor team" for a team above the
//! reader's teams, which members may know is there but not read).
//!
//! Only text Berth wrote goes through here (statuses, events, reasons): a workload's own
//! spec is its owner's and never rewritten.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::team::QuotaPreview;
use crate::workload::{Workload, WorkloadStatus};

/// What a reader may not see: the team names it cannot read, with the words each becomes.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    hidden: BTreeMap<String, &'static str>,
}

const ANOTHER: &str = "another team";
const ANCESTOR: &str = "an ancestor team";

impl Redactor {
    /// A redactor that hides nothing (platform admins, global viewers).
    pub fn none() -> Self {
        Self::default()
    }

    /// Hides `hidden` teams; those in `ancestors` (above a team the reader can read) are
    /// called ancestors.
    pub fn hiding(hidden: impl IntoIterator<Item = (String, bool)>) -> Self {
        Self {
            hidden: hidden.into_iter().map(|(t, ancestor)| (t, if ancestor { ANCESTOR } else { ANOTHER })).collect(),
        }
    }

    /// Whether the reader may read `team`'s names.
    pub fn shows(&self, team: &str) -> bool {
        !self.hidden.contains_key(team)
    }

    /// `team`'s name, or the words it becomes for this reader ("another team", "an
    /// ancestor team"): for a message built for the reader, where [`Self::text`] could
    /// also replace other words that read like a hidden team's name.
    pub fn team(&self, team: &str) -> String {
        self.hidden.get(team).map_or_else(|| team.to_owned(), |&instead| instead.to_owned())
    }

    /// `text` with every hidden team's name replaced. A name counts only as a whole word
    /// (team names are DNS labels, so `nlp` in `nlp-2` is another name).
    pub fn text(&self, text: &str) -> String {
        if self.hidden.is_empty() {
            return text.to_owned();
        }
        let is_word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find(is_word) {
            out.push_str(&rest[..start]);
            let word_len = rest[start..].find(|c: char| !is_word(c)).unwrap_or(rest.len() - start);
            let word = &rest[start..start + word_len];
            let after = &rest[start + word_len..];
            match self.hidden.get(word) {
                Some(&instead) => {
                    // "team vision" reads "another team", not "team another team".
                    if out.ends_with("team ") {
                        out.truncate(out.len() - "team ".len());
                    }
                    out.push_str(instead);
                    // "vision/train-3": the workload's name goes with its team's.
                    if let Some(tail) = after.strip_prefix('/') {
                        let name_len = tail.find(|c: char| !is_word(c)).unwrap_or(tail.len());
                        out.push_str("'s workload");
                        rest = &tail[name_len..];
                        continue;
                    }
                }
                None => {
                    out.push_str(word);
                    // A shown team's workload keeps its name, even one that reads like a
                    // hidden team's.
                    if let Some(tail) = after.strip_prefix('/') {
                        let name_len = tail.find(|c: char| !is_word(c)).unwrap_or(tail.len());
                        out.push('/');
                        out.push_str(&tail[..name_len]);
                        rest = &tail[name_len..];
                        continue;
                    }
                }
            }
            rest = after;
        }
        out.push_str(rest);
        out
    }

    /// Every string in `value`, redacted (object keys are Berth's field names and stay).
    pub fn value(&self, value: &mut Value) {
        if self.hidden.is_empty() {
            return;
        }
        match value {
            Value::String(s) => *s = self.text(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v)),
            Value::Object(fields) => fields.values_mut().for_each(|v| self.value(v)),
            _ => {}
        }
    }

    /// The words Berth wrote into a workload's status.
    pub fn status(&self, status: &mut WorkloadStatus) {
        if self.hidden.is_empty() {
            return;
        }
        for text in [&mut status.message, &mut status.reason].into_iter().flatten() {
            *text = self.text(text);
        }
        if let Some(p) = &mut status.pending_reason {
            p.message = self.text(&p.message);
            if let Some(details) = &mut p.details {
                self.value(details);
            }
        }
        if let Some(e) = &mut status.estimated_start {
            e.basis = self.text(&e.basis);
        }
    }

    pub fn workload(&self, mut w: Workload) -> Workload {
        self.status(&mut w.status);
        w
    }

    /// A quota preview without the hidden teams' workloads' names and fair shares.
    pub fn preview(&self, mut p: QuotaPreview) -> QuotaPreview {
        if self.hidden.is_empty() {
            return p;
        }
        for listed in [
            &mut p.admitted,
            &mut p.no_longer_admitted,
            &mut p.preempted,
            &mut p.no_longer_preempted,
            &mut p.preempted_once_protected_ends,
            &mut p.kept_beyond_guarantee,
        ] {
            for w in listed.iter_mut().filter(|w| !w.team.as_deref().is_some_and(|t| self.shows(t))) {
                w.team = None;
                w.name = None;
            }
        }
        p.fair_shares.retain(|c| self.shows(&c.team));
        p.over_limit.retain(|o| self.shows(&o.team));
        p.summary = p.summarize();
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Redactor {
        Redactor::hiding([("vision".to_owned(), false), ("research".to_owned(), true)])
    }

    #[test]
    fn hidden_names_become_another_team_as_whole_words_only() {
        let r = redactor();
        assert_eq!(
            r.text("waiting for vision/train-3 to stop on east/h100"),
            "waiting for another team's workload to stop on east/h100"
        );
        assert_eq!(
            r.text("preempted: team vision reclaims its guarantee for vision/w"),
            "preempted: another team reclaims its guarantee for another team's workload"
        );
        assert_eq!(
            r.text("team research would exceed its h100 limit: uses 8"),
            "an ancestor team would exceed its h100 limit: uses 8"
        );
        assert_eq!(r.text("vision-2 and supervision and nlp/vision"), "vision-2 and supervision and nlp/vision");
        assert_eq!(r.text(""), "");
    }

    #[test]
    fn a_reader_who_sees_everything_reads_the_text_unchanged() {
        let text = "waiting for vision/train-3 to stop";
        assert_eq!(Redactor::none().text(text), text);
    }

    fn preview_workload(team: &str, name: &str, gpus: f64) -> crate::team::PreviewWorkload {
        crate::team::PreviewWorkload { team: Some(team.into()), name: Some(name.into()), gpus }
    }

    #[test]
    fn a_preview_reader_sees_the_effect_on_other_teams_but_not_their_names() {
        use crate::team::{FairShareChange, OverLimit, PreviewWorkload};
        let share = |team: &str| FairShareChange { team: team.into(), flavor: "h100".into(), before: 4.0, after: 8.0 };
        let over = |team: &str| OverLimit { team: team.into(), flavor: "h100".into(), holds: 12.5, limit: 8 };
        let mut full = QuotaPreview {
            summary: Vec::new(),
            admitted: vec![preview_workload("a", "a1", 8.0)],
            no_longer_admitted: Vec::new(),
            preempted: vec![preview_workload("b", "b1", 4.0), preview_workload("b", "b2", 4.5)],
            no_longer_preempted: Vec::new(),
            preempted_once_protected_ends: vec![preview_workload("b", "b3", 2.0)],
            kept_beyond_guarantee: vec![preview_workload("a", "a0", 1.0), preview_workload("a", "a9", 1.0)],
            fair_shares: vec![share("a"), share("b")],
            over_limit: vec![over("a"), over("b")],
        };
        full.summary = full.summarize();
        let seen = Redactor::hiding([("b".to_owned(), false)]).preview(full.clone());
        assert_eq!(seen.admitted, full.admitted);
        assert_eq!(
            seen.preempted,
            vec![
                PreviewWorkload { team: None, name: None, gpus: 4.0 },
                PreviewWorkload { team: None, name: None, gpus: 4.5 }
            ]
        );
        assert_eq!(seen.preempted_once_protected_ends, vec![PreviewWorkload { team: None, name: None, gpus: 2.0 }]);
        assert_eq!(seen.kept_beyond_guarantee, full.kept_beyond_guarantee);
        assert_eq!(seen.fair_shares, vec![share("a")]);
        assert_eq!(seen.over_limit, vec![over("a")]);
        assert_eq!(
            seen.summary,
            [
                "2 workloads would be preempted (8.5 GPUs: another team)",
                "1 workload would be admitted (8 GPUs: a)",
                "1 workload would be preempted once its min runtime ends, not before (2 GPUs: another team)",
                "2 workloads would run on beyond their team's guarantee until done: non-preemptible, never preempted \
                 (2 GPUs: a)",
                "fair share of a on h100: 4 → 8 GPUs",
                "a would run 12.5 GPUs of h100, above its limit of 8: nothing is preempted for that, \
                 but its subtree gets no more h100 until it is under",
            ]
        );
        let admin = Redactor::none().preview(full);
        assert_eq!(admin.summary[0], "2 workloads would be preempted (8.5 GPUs: b)");
    }

    #[test]
    fn every_text_of_a_status_is_redacted() {
        use crate::workload::{PendingReason, StartEstimate};
        let words = "waiting for vision/train-3 to stop";
        let mut status = WorkloadStatus {
            message: Some(words.into()),
            reason: Some(words.into()),
            pending_reason: Some(PendingReason {
                code: "Reclaim".into(),
                message: words.into(),
                details: Some(serde_json::json!({"victims": ["vision/train-3"]})),
            }),
            estimated_start: Some(StartEstimate {
                at: chrono::DateTime::UNIX_EPOCH,
                basis: "when vision/train-3 reaches its max_runtime_seconds; 0 workloads start before it".into(),
            }),
            ..WorkloadStatus::default()
        };
        redactor().status(&mut status);
        let seen = serde_json::to_string(&status).unwrap();
        assert!(!seen.contains("vision"), "{seen}");
        assert_eq!(
            status.estimated_start.unwrap().basis,
            "when another team's workload reaches its max_runtime_seconds; 0 workloads start before it"
        );
    }

    #[test]
    fn details_are_redacted_value_by_value() {
        let mut v = serde_json::json!({"team": "vision", "victims": ["vision/a", "nlp/b"], "used": 3});
        redactor().value(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"team": "another team", "victims": ["another team's workload", "nlp/b"], "used": 3})
        );
    }
}
