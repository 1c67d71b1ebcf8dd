//! What the benchmark prints and writes.

use serde_json::{Value, json};

/// The figures of a run of the benchmark: a table to print and the JSON to write.
#[derive(Default)]
pub struct Report {
    /// Section, metric, value, unit and goal, and whether the goal is met.
    rows: Vec<(String, String, f64, String, Option<bool>)>,
    pub json: serde_json::Map<String, Value>,
}

impl Report {
    pub fn add(
        &mut self,
        section: &str,
        metric: &str,
        value: f64,
        unit: &str,
        goal: Option<(&str, bool)>,
    ) {
        let (goal_text, met) = match goal {
            Some((text, met)) => (text.to_string(), Some(met)),
            None => (String::new(), None),
        };
        self.rows.push((
            section.into(),
            metric.into(),
            value,
            format!("{unit} {goal_text}"),
            met,
        ));
        self.json.insert(
            format!("{section}.{metric}"),
            json!({"value": value, "unit": unit, "goal": goal_text, "met": met}),
        );
    }

    pub fn print(&self) {
        println!(
            "\n{:<10} {:<46} {:>14}  unit / goal",
            "section", "metric", "value"
        );
        for (section, metric, value, unit, met) in &self.rows {
            let mark = match met {
                Some(true) => "  [met]",
                Some(false) => "  [MISSED]",
                None => "",
            };
            println!("{section:<10} {metric:<46} {value:>14.3}  {unit}{mark}");
        }
    }
}

impl Report {
    /// Adds, for every figure of `rounds` (reports of one section run several times, an odd
    /// number), its median, with every round's value in the JSON (`rounds`). A goal is met by
    /// the median exactly when it is met in most rounds (a threshold, an odd count), so that
    /// is what is reported.
    pub fn add_medians(&mut self, rounds: &[Report]) {
        let Some(first) = rounds.first() else {
            return;
        };
        for (section, metric, _, unit_goal, _) in &first.rows {
            let same = |r: &&(String, String, f64, String, Option<bool>)| {
                &r.0 == section && &r.1 == metric
            };
            let found: Vec<&(String, String, f64, String, Option<bool>)> = rounds
                .iter()
                .filter_map(|round| round.rows.iter().find(same))
                .collect();
            let values: Vec<f64> = found.iter().map(|r| r.2).collect();
            let mut sorted = values.clone();
            sorted.sort_by(|a, b| a.total_cmp(b));
            let median = sorted[sorted.len() / 2];
            let judged: Vec<bool> = found.iter().filter_map(|r| r.4).collect();
            let met = (!judged.is_empty())
                .then(|| judged.iter().filter(|m| **m).count() * 2 > judged.len());
            self.rows.push((
                section.clone(),
                format!("{metric} (median of {})", values.len()),
                median,
                unit_goal.clone(),
                met,
            ));
            let mut entry = first.json[&format!("{section}.{metric}")].clone();
            entry["value"] = json!(median);
            entry["met"] = json!(met);
            entry["rounds"] = json!(values);
            self.json.insert(format!("{section}.{metric}"), entry);
        }
    }

    /// The value of `section.metric`, if reported.
    pub fn value(&self, section: &str, metric: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.0 == section && r.1 == metric)
            .map(|r| r.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_median_meets_its_goal_when_most_rounds_do() {
        let rounds: Vec<Report> = [650.0, 900.0, 720.0]
            .into_iter()
            .map(|rate| {
                let mut r = Report::default();
                r.add(
                    "e2e",
                    "runs/s",
                    rate,
                    "/s",
                    Some(("goal >= 700/s", rate >= 700.0)),
                );
                r.add("e2e", "latency", rate / 100.0, "ms", None);
                r
            })
            .collect();
        let mut merged = Report::default();
        merged.add_medians(&rounds);
        assert_eq!(merged.value("e2e", "runs/s (median of 3)"), Some(720.0));
        assert_eq!(merged.rows[0].4, Some(true));
        assert_eq!(merged.rows[1].4, None, "no goal, no verdict");
        assert_eq!(
            merged.json["e2e.runs/s"]["rounds"],
            json!([650.0, 900.0, 720.0])
        );
        assert_eq!(merged.json["e2e.runs/s"]["value"], json!(720.0));
    }
}
